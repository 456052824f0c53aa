"""Test hosts: a small cluster on one machine, out of Linux network namespaces.

Each host is a network namespace with its own address, host name and hosts file (as cluster DNS would give),
joined to the others by a veth pair on a bridge that lives in a namespace of its own (`<id>-sw`), so nothing
touches the machine's own interfaces, and traffic only ever goes between the testbed's hosts. A process runs
"on" a host with `Testbed.popen(host, cmd)`: `ip netns exec` (which also puts /etc/netns/NS/hosts over
/etc/hosts) in a UTS namespace whose host name is the host's. Every testbed is torn down completely: its
processes killed, its namespaces (and with them their links) deleted, its hosts files removed; `leftovers()`
names anything of a testbed that survived, and the test fixtures assert it is nothing.

    python infra/testbed.py up control store node-0 node-1     # prints the hosts and addresses (as root)
    python infra/testbed.py exec node-0 -- curl -s http://store:9000/   (within the same testbed id)
    python infra/testbed.py down                                # everything it made, gone

Root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and Debian's iproute2 and util-linux are needed; CI runs as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "rltb"  # every namespace, link and hosts folder a testbed makes starts with this
NETNS_ETC = Path("/etc/netns")
STATE = Path(os.environ.get("ROBOLOOP_TESTBED_STATE", "/run/roboloop-testbed"))  # the CLI's `up` -> `down`


class TestbedError(RuntimeError):
    pass


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)}: {r.stderr.strip()}")


@dataclass
class Testbed:
    """Hosts `names` on 198.18.<subnet>.0/24 (RFC 2544's benchmarking range, used by no network) behind the
    testbed's own bridge. The hosts have no route beyond it, and nothing here sends to them from outside."""

    names: list[str]
    tid: str = field(default_factory=lambda: f"{PREFIX}{os.getpid() % 100000}")
    subnet: int = 0
    addresses: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    hostnames: dict[str, str] = field(default_factory=dict)  # a host's host name, where it is not the host's name
    aliases: dict[str, list[str]] = field(default_factory=dict)  # more names of a host in every hosts file

    def ns(self, host: str) -> str:
        return f"{self.tid}-{host}"

    @property
    def switch(self) -> str:
        return f"{self.tid}-sw"

    def up(self) -> Testbed:
        if os.geteuid() != 0:
            raise TestbedError("test hosts need root (network namespaces, veth links, a bridge)")
        # each testbed has a bridge of its own, so equal subnets of two testbeds never meet; varied for reading
        self.subnet = self.subnet or 200 + zlib.crc32(self.tid.encode()) % 50
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
            _ip("link", "set", "br0", "up", ns=self.switch)
            for i, host in enumerate(self.names):
                self._add_host(i, host)
            for host in self.names:
                self._hosts_file(host)
        except BaseException:
            self.down()
            raise
        return self

    def _add_host(self, i: int, host: str) -> None:
        ns, addr = self.ns(host), f"198.18.{self.subnet}.{10 + i}"
        a, b = f"{self.tid}h{i}", f"{self.tid}s{i}"  # at most 15 characters
        _ip("netns", "add", ns)
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        _ip("link", "set", a, "netns", ns)
        _ip("link", "set", b, "netns", self.switch)
        _ip("link", "set", b, "master", "br0", ns=self.switch)
        _ip("link", "set", b, "up", ns=self.switch)
        _ip("link", "set", a, "name", "eth0", ns=ns)
        _ip("addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
        _ip("link", "set", "eth0", "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        self.addresses[host] = addr

    def _hosts_file(self, host: str) -> None:
        d = NETNS_ETC / self.ns(host)
        d.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", *(" ".join([addr, name, *self.aliases.get(name, [])])
                                          for name, addr in self.addresses.items())]
        (d / "hosts").write_text("\n".join(lines) + "\n")

    def command(self, host: str, cmd: list[str]) -> list[str]:
        """`cmd` as run on `host`: its network, hosts file and host name."""
        if host not in self.addresses:
            raise TestbedError(f"no host {host!r} in this testbed ({', '.join(self.addresses)})")
        return ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "--", "sh", "-c",
                'hostname "$0" && exec "$@"', self.hostnames.get(host, host), *cmd]

    def name(self, host: str, hostname: str, *aliases: str) -> None:
        """From now on, processes on `host` see the host name `hostname`, and every host resolves `hostname` and
        `aliases` to `host`'s address (what a pod's host name and cluster DNS give it)."""
        self.hostnames[host] = hostname
        self.aliases[host] = [hostname, *aliases]
        for h in self.names:
            self._hosts_file(h)

    def kill(self, host: str) -> list[int]:
        """kill -9 every process on `host` (a machine lost at once); returns their pids."""
        pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", self.ns(host)], capture_output=True,
                                               text=True).stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def run(self, host: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, cmd), **{"capture_output": True, "text": True, **kw})

    def popen(self, host: str, cmd: list[str], **kw) -> subprocess.Popen:
        """A long-running process on `host`, in a process group of its own; killed by `down()`."""
        p = subprocess.Popen(self.command(host, cmd), start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def cut(self, host: str) -> None:
        """Pull `host`'s cable: its link on the bridge goes down (connections time out, nothing is refused)."""
        _ip("link", "set", f"{self.tid}s{self.names.index(host)}", "down", ns=self.switch)

    def mend(self, host: str) -> None:
        _ip("link", "set", f"{self.tid}s{self.names.index(host)}", "up", ns=self.switch)

    def down(self) -> None:
        """Kill every process of the testbed, delete its namespaces (their links go with them) and hosts files."""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        teardown(self.tid)

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def _namespaces(tid: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(tid + "-")]


def teardown(tid: str) -> None:
    """Everything testbed `tid` made: processes inside its namespaces, the namespaces, the hosts files."""
    for ns in _namespaces(tid):
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        deadline = time.time() + 10
        while subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split() \
                and time.time() < deadline:
            time.sleep(0.05)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    for d in NETNS_ETC.glob(f"{tid}-*") if NETNS_ETC.is_dir() else []:
        shutil.rmtree(d, ignore_errors=True)


def leftovers(tid: str = PREFIX) -> list[str]:
    """What testbed `tid` (default: any testbed) left behind: namespaces, links, hosts folders, processes."""
    left = [f"netns {n}" for n in _namespaces(tid) or []]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    left += [f"link {ln.split(':')[1].strip().split('@')[0]}" for ln in links.splitlines()
             if ln.split(":")[1].strip().startswith(tid)]
    left += [f"hosts {d}" for d in (NETNS_ETC.glob(f"{tid}*") if NETNS_ETC.is_dir() else [])]
    return left


def main(argv: list[str]) -> int:
    """`up HOST...` (state kept in $ROBOLOOP_TESTBED_STATE), `exec HOST -- CMD...`, `down`, `status`."""
    if not argv or argv[0] not in ("up", "down", "exec", "status"):
        print(__doc__.split("\n\n")[2] if "\n\n" in __doc__ else __doc__, file=sys.stderr)
        return 2
    if argv[0] == "up":
        tb = Testbed(argv[1:] or ["control", "store", "node-0", "node-1"]).up()
        STATE.parent.mkdir(parents=True, exist_ok=True)
        STATE.write_text(json.dumps({"tid": tb.tid, "names": tb.names, "subnet": tb.subnet,
                                     "addresses": tb.addresses}))
        print(json.dumps({"testbed": tb.tid, "hosts": tb.addresses}))
        return 0
    state = json.loads(STATE.read_text()) if STATE.exists() else None
    if argv[0] == "down":
        if state:
            teardown(state["tid"])
            STATE.unlink()
        left = leftovers()
        print(json.dumps({"left": left}))
        return 1 if left else 0
    if state is None:
        print("no testbed is up (infra/testbed.py up)", file=sys.stderr)
        return 1
    if argv[0] == "status":
        print(json.dumps({**state, "left_if_down": leftovers(state["tid"])}))
        return 0
    host, rest = argv[1], argv[argv.index("--") + 1:] if "--" in argv else argv[2:]
    tb = Testbed(state["names"], state["tid"], state["subnet"], state["addresses"])
    return subprocess.run(tb.command(host, rest)).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
