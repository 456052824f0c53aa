"""`roboloop serve` (a model folder or registry reference behind the policy server) and `roboloop robot` (a robot
driven by a served policy): the two ends of `roboloop.serving`."""

from __future__ import annotations

import argparse
import logging
import sys


def _say(line: str) -> None:
    """One line to stderr in a single write. `print` writes the text and its newline separately, and the server's
    thread logs as soon as it starts: its line once landed between the two, so a reader of "listening on
    ws://HOST:PORT" took the port's digits and the log's date as one number (a real SO-101 serve check)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def add_parsers(sub, options) -> None:  # options: no pydantic-generated flags here
    """The parsers of serve, export and robot."""
    _serve_parser(sub)
    _export_parser(sub)
    _robot_parser(sub)


def _serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a policy to robots and simulators over websocket + msgpack (token "
                       "required; follows the registry when REF is an alias such as registry:NAME@champion)")
    s.add_argument("ref", help="a model folder, registry:NAME@champion (followed: a promotion is loaded, checked "
                   "and swapped in) or registry:NAME@3 (pinned)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8765, help="port (0: any free one; printed on start)")
    s.add_argument("--device", default="cpu", help="torch device for the model")
    s.add_argument("--seed", type=int, default=0, help="the model's noise seed (flow-matching sampling)")
    s.add_argument("--max-batch", type=int, default=0, help="observations in one forward pass (1: no batching; 0: "
                   "64, except on a CPU where one pass over 8 observations, timed at start, is not 1.1x faster "
                   "per observation than 8 passes over one: then 1)")
    s.add_argument("--max-wait-ms", type=float, default=None, help="how long the first request of a batch waits "
                   "for the other sessions that are acting (asked in the last second) and have not asked yet; one "
                   "robot never waits (default 5; 0: no wait; requests arriving during a forward pass still share "
                   "the next one). --engine ray: Serve's batch wait, which every batch waits (default 0)")
    s.add_argument("--threads", type=int, default=0, help="torch threads for forward passes (0: on a CPU, cores "
                   "less one, left to the network side, or every core where the model's forward pass, timed at "
                   "start, is at least 1.2x faster on them)")
    s.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="what forward passes run in: fp32 "
                   "(default: the chunks a model gives in-process) or bf16 autocast, refused where the device does "
                   "not multiply bf16 natively (a CPU without AMX or AVX512-BF16); the start-up line gives its "
                   "largest difference from fp32 on the check observation")
    s.add_argument("--follow-interval", type=float, default=2.0, help="seconds between looks at the registry alias")
    s.add_argument("--max-message-mb", type=float, default=None, help="the largest request in MiB (default 32, "
                   "36 frames of 480x640; --engine ray: at most 16, its proxy's limit); a larger one closes its "
                   "connection (1009) and clients refuse to send one")
    s.add_argument("--max-connections", type=int, help="connections at once (all holders of the token; default "
                   "64; --engine ray: per replica); more are refused at the handshake (HTTP 503; ray: 403)")
    s.add_argument("--idle-timeout", type=float, help="seconds a connection may send nothing (default 300)")
    s.add_argument("--send-timeout", type=float, help="seconds a client may take to read a reply before its "
                   "connection is dropped (default 10)")
    s.add_argument("--token-file", help="the token file (default $ROBOLOOP_SERVE_TOKEN_FILE or "
                   ".roboloop/serve-token; created with mode 600 when absent)")
    s.add_argument("--engine", choices=["process", "ray"], default="process", help="process (default: one process, "
                   "the lowest latency for a robot or a simulator on this machine) or ray (a Ray Serve application: "
                   "replicas, several machines, KubeRay's RayService)")
    s.add_argument("--replicas", type=int, default=1, help="--engine ray: model replicas")
    s.add_argument("--replicas-per-node", type=int, help="--engine ray: at most this many replicas on one machine "
                   "(1: each on its own, so losing a machine loses one replica; default: Ray places them)")
    s.add_argument("--ray-address", help="--engine ray: join this Ray cluster (default: start one here)")
    s.set_defaults(fn=cmd_serve)


def _export_parser(sub) -> None:
    x = sub.add_parser("export", help="export a model (folder or registry:NAME@REF) for onnxruntime, checked against "
                       "PyTorch; `roboloop serve EXPORT_DIR` serves it")
    x.add_argument("ref", help="a model folder or registry:NAME@REF")
    x.add_argument("--format", default="onnx", choices=["onnx"], help="onnx (roboloop's VLA)")
    x.add_argument("--output", required=True, help="the export folder to write (never replaces what roboloop did "
                   "not write)")
    x.add_argument("--instruction", default="", help="the instruction the export is for (its tokens are part of "
                   "the graph: export once per instruction)")
    x.add_argument("--overwrite", action="store_true", help="replace an earlier export at --output (moved aside)")
    x.set_defaults(fn=cmd_export)


def _robot_parser(sub) -> None:
    r = sub.add_parser("robot", help="drive a robot (LeRobot's robot classes, e.g. so101_follower; or sim: a roboloop "
                       "task's simulator behind the same interface) with action chunks from `roboloop serve`")
    r.add_argument("--server", required=True, help="HOST:PORT of `roboloop serve` (token from --token-file)")
    r.add_argument("--robot.type", dest="robot_type", default="so101_follower", help="a LeRobot robot type "
                   "(so101_follower, so100_follower, ...) or sim")
    r.add_argument("--robot.port", dest="robot_port", help="the servo bus's serial port (e.g. /dev/ttyACM0)")
    r.add_argument("--robot.id", dest="robot_id", help="the robot's id (its calibration file's name)")
    r.add_argument("--robot.calibration-dir", dest="robot_calibration_dir", help="the folder of the robot's "
                   "calibration file (default: LeRobot's, ~/.cache/huggingface/lerobot/calibration/robots/TYPE)")
    r.add_argument("--robot.cameras", dest="robot_cameras", default="{}", help='LeRobot camera configs as JSON, '
                   'e.g. \'{"front": {"type": "opencv", "index_or_path": 0, "width": 640, "height": 480, "fps": 30}}\'')
    r.add_argument("--robot.max-relative-target", dest="robot_max_relative_target", type=float,
                   help="LeRobot's own cap on each joint's move per action (default: --max-step-deg)")
    _envelope_args(r)
    r.add_argument("--task", default="Roboloop-SO101-PickCube-v0", help="--robot.type sim: the simulated task")
    r.add_argument("--instruction", default="", help="the task string sent with each observation")
    r.add_argument("--fps", type=float, default=30.0, help="control rate")
    r.add_argument("--execute-steps", type=int, default=8, help="actions of a chunk executed before the next")
    r.add_argument("--prefetch", type=int, default=4, help="ask for the next chunk when this many actions are left "
                   "(0: only when none is)")
    r.add_argument("--max-steps", type=int, default=0, help="stop after this many ticks (0: until Ctrl-C)")
    r.add_argument("--on-server-loss", choices=["auto", "hold", "stop"], default="auto", help="when the server "
                   "goes away: hold (send the robot's present positions each tick while reconnecting, then resume "
                   "with a fresh chunk; stop when --reconnect tries are spent), stop (end at once, exit 3), or auto "
                   "(default: hold where the robot observes a position for every action, as LeRobot's arms do)")
    r.add_argument("--reply-timeout", type=float, default=2.0, help="seconds to wait for a chunk; past that the "
                   "connection counts as lost (the arm holds and the client reconnects)")
    r.add_argument("--reconnect", type=int, default=5, help="tries to reconnect to a lost server (0.5 s, doubled "
                   "each try, at most 8 s apart); the server must come back serving the same interface")
    r.add_argument("--token-file", help="the server's token file (default $ROBOLOOP_SERVE_TOKEN_FILE)")
    r.set_defaults(fn=cmd_robot)


def _envelope_args(r) -> None:
    from roboloop.serving import envelope as env

    r.add_argument("--limits", help="a JSON file of each action's limits ({\"JOINT.pos\": {\"min\": -90, \"max\": "
                   "90, \"units\": \"deg\"}, ...}) for an arm without a calibrated LeRobot motor bus (default: the "
                   "robot's calibration; sim: the task's action bounds)")
    r.add_argument("--max-step-deg", type=float, help=f"the most a joint's target may move in one tick, in degrees "
                   f"(a gripper in percent: the same motion of its servo) (default {env.MAX_STEP_DEG:g}; sim: none)")
    r.add_argument("--max-accel-deg", type=float, help=f"the most a joint's step may change from one tick to the "
                   f"next, in degrees (default {env.MAX_ACCEL_DEG:g}; sim: none)")
    r.add_argument("--max-first-deg", type=float, help=f"the most a chunk's first target may be from where the "
                   f"joint is, in degrees (default {env.MAX_FIRST_DEG:g}; sim: none)")
    r.add_argument("--on-violation", choices=["auto", *env.ON_VIOLATION], default="auto", help="a chunk outside "
                   "the envelope (limits, step, acceleration, first target): hold (refused, the arm holds where it is "
                   "and the next chunk is asked for), clamp (each target clamped into the envelope), or auto "
                   "(default: hold where the robot observes a position for every action, as LeRobot's arms do; else "
                   "clamp)")
    r.add_argument("--max-lag-ms", type=float, help="a chunk's action later than this after its due time (its "
                   "observation's time plus its place in the chunk) is stale and refused (default: the chunk's "
                   "length, horizon / fps)")


def cmd_serve(args: argparse.Namespace) -> int:
    from roboloop.serving.server import ServeConfig, Server
    from roboloop.serving.token import read_token

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        _say(f"roboloop serve: binding {args.host}: anyone who reaches it and holds the token drives the robot; "
             "put TLS in front (wss://) off a trusted network")
    if args.engine != "ray" and (args.replicas != 1 or args.ray_address or args.replicas_per_node):  # refused
        raise ValueError("--replicas, --replicas-per-node and --ray-address apply to --engine ray only (the process "
                         "engine is one "
                         "process on this machine)")
    limits = {"max_connections": args.max_connections, "idle_timeout_s": args.idle_timeout,
              "send_timeout_s": args.send_timeout}
    token = read_token(args.token_file, create=True)
    logging.getLogger("roboloop.serve").setLevel(logging.INFO)
    max_bytes = _max_message_bytes(args)
    cfg = ServeConfig(args.ref, args.host, args.port, args.device, args.seed, args.max_batch or 64,
                      args.max_wait_ms if args.max_wait_ms is not None else 0.0 if args.engine == "ray" else 5.0,
                      max_message_bytes=max_bytes, follow_interval_s=args.follow_interval, threads=args.threads,
                      precision=args.precision, **{k: v for k, v in limits.items() if v is not None})
    if args.engine == "ray":
        return _serve_ray(cfg, args)
    import os

    import torch

    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) - 1))
    server = Server(cfg, token)
    _say(_start_line(server, cfg, args))
    server.start()
    _say(f"roboloop serve: listening on ws://{args.host}:{server.port}")
    try:
        assert server.thread is not None
        server.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _max_message_bytes(args: argparse.Namespace) -> int:
    from roboloop.serving import wire

    limit = wire.RAY_PROXY_MAX_BYTES if args.engine == "ray" else wire.MAX_MESSAGE_BYTES
    max_bytes = int(args.max_message_mb * 2**20) if args.max_message_mb is not None else limit
    if args.engine == "ray" and max_bytes > limit:
        raise ValueError(f"--max-message-mb {args.max_message_mb:g}: Ray Serve's proxy closes websocket messages "
                         f"over {limit >> 20} MiB; use --engine process for larger requests, or send fewer rows")
    return max_bytes


def _start_line(server, cfg, args: argparse.Namespace) -> str:
    """What the server runs, said once at start: the version, threads and batching it chose (and why), the token."""
    import os

    import torch

    from roboloop.serving.token import token_path

    spec = server.service.slot.spec()
    threads = f"{torch.get_num_threads()} torch threads ({'--threads' if cfg.threads else 'cores less one'})"
    torch_on_cpu = cfg.device == "cpu" and spec["runtime"] not in ("OnnxPolicy", "OnnxLeRobotPolicy")
    if not cfg.threads and torch_on_cpu:
        from roboloop.serving.tuning import choose_threads

        n, why = server.service.compute.submit(choose_threads, server.service.slot, os.cpu_count() or 1).result()
        threads = f"{n} torch threads ({why})"
    batching = f"batches of up to {cfg.max_batch} (--max-batch)" if args.max_batch else "batches of up to 64"
    if not args.max_batch and torch_on_cpu:
        from roboloop.serving.tuning import choose_batching

        cfg.max_batch, why = server.service.compute.submit(choose_batching, server.service.slot).result()
        batching = f"batches of up to {cfg.max_batch} ({why})"
    slot = server.service.slot
    precision = slot.precision
    if slot.deviation is not None:
        precision += f", at most {slot.deviation[0]:.3g} from fp32 (actions up to {slot.deviation[1]:.3g})"
    return (f"roboloop serve: {spec['version']} ({spec['state_dim']}-dim state, cameras {spec['camera_keys']}, "
            f"chunks of {spec['horizon']}x{spec['action_dim']}); {precision}; {threads}; {batching}; "
            f"token in {token_path(args.token_file)}"
            + (f"; following {server.follow[1]}@{server.follow[2]}" if server.follow else ""))


def _serve_ray(cfg, args: argparse.Namespace) -> int:
    import socket
    import time

    from roboloop.serving import ray_serve
    from roboloop.serving.token import token_path

    if cfg.port == 0:  # Serve's proxy needs a concrete port
        with socket.socket() as s:
            s.bind((cfg.host, 0))
            cfg.port = s.getsockname()[1]
    ray_serve.run(cfg, str(token_path(args.token_file).absolute()), args.replicas, args.ray_address,
                  args.replicas_per_node)
    _say(f"roboloop serve: Ray Serve, {args.replicas} replica(s); listening on ws://{cfg.host}:{cfg.port}")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        ray_serve.shutdown()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import json

    from roboloop.serving.export import export_onnx

    folder = args.ref
    if folder.startswith("registry:"):
        from roboloop.registry import resolve_model_ref

        folder = str(resolve_model_ref(folder))
    meta = export_onnx(folder, args.output, args.instruction, overwrite=args.overwrite)
    print(json.dumps(meta))
    return 0


def _import_all(package) -> None:
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(package.__path__):
        if m.ispkg:
            try:
                importlib.import_module(f"{package.__name__}.{m.name}")
            except ImportError:  # a family whose SDK is not installed: not offered
                continue


def lerobot_robot(args: argparse.Namespace):
    """LeRobot's own robot object for `--robot.type` (its config class, its cameras), connected."""
    import dataclasses
    import json

    import lerobot.cameras
    import lerobot.robots
    from lerobot.cameras import CameraConfig
    from lerobot.robots import RobotConfig, make_robot_from_config

    _import_all(lerobot.robots)  # each robot family and camera kind registers its config when imported
    _import_all(lerobot.cameras)
    known = sorted(RobotConfig.get_known_choices())
    if args.robot_type not in known:
        raise ValueError(f"--robot.type {args.robot_type!r}: LeRobot knows {', '.join(known)} (or use sim)")
    cams = {}
    for name, c in json.loads(args.robot_cameras).items():
        c = dict(c)
        cams[name] = CameraConfig.get_choice_class(c.pop("type", "opencv"))(**c)
    kw = {"port": args.robot_port, "cameras": cams}
    if args.robot_id:
        kw["id"] = args.robot_id
    # LeRobot's own cap, from the same bound as the envelope's step: a second line of defence inside the robot class
    # (it limits each move from the *present* position, so a far target still walks there a step a tick: the
    # envelope refuses such a target first)
    from roboloop.serving.envelope import MAX_STEP_DEG

    config_class = RobotConfig.get_choice_class(args.robot_type)
    fields = {f.name for f in dataclasses.fields(config_class)}
    if "max_relative_target" in fields:
        kw["max_relative_target"] = next(v for v in (args.robot_max_relative_target, args.max_step_deg,
                                                     MAX_STEP_DEG) if v is not None)
    elif args.robot_max_relative_target is not None:
        raise ValueError(f"--robot.max-relative-target: LeRobot's {args.robot_type} has no such setting")
    if args.robot_calibration_dir:
        from pathlib import Path

        kw["calibration_dir"] = Path(args.robot_calibration_dir)
    robot = make_robot_from_config(config_class(**kw))
    robot.connect()
    return robot


# `roboloop robot`'s exit codes: why the loop ended
EXIT_DONE, EXIT_SERVER_LOST, EXIT_ROBOT_FAULT, EXIT_STOPPED = 0, 3, 4, 130


def _loop_config(args: argparse.Namespace, realtime: bool):
    from roboloop.serving import envelope as env
    from roboloop.serving.robot import RobotLoopConfig

    sim = args.robot_type == "sim"

    def bound(value: float | None, default: float) -> float | None:
        return value if value is not None else None if sim else default

    return RobotLoopConfig(args.fps, args.execute_steps, args.prefetch, args.instruction, args.max_steps, realtime,
                           on_server_loss=args.on_server_loss, max_step=bound(args.max_step_deg, env.MAX_STEP_DEG),
                           max_accel=bound(args.max_accel_deg, env.MAX_ACCEL_DEG),
                           max_first=bound(args.max_first_deg, env.MAX_FIRST_DEG), on_violation=args.on_violation,
                           limits_file=args.limits,
                           max_lag_s=args.max_lag_ms / 1e3 if args.max_lag_ms is not None else None)


def cmd_robot(args: argparse.Namespace) -> int:
    """Exit 0 after --max-steps, 130 on the operator's stop (Ctrl-C or SIGTERM: the arm is brought to rest first),
    3 when the server is lost for good (the arm holds, torque on), 4 when the robot itself fails."""
    import json
    import signal

    from roboloop.serving.client import PolicyClient, ServerLostError
    from roboloop.serving.robot import RobotFault, RobotLoop

    robot, realtime = _make_robot(args)

    def stop(signum, frame):  # SIGTERM (a service manager, Prefect's cancel) is the operator's stop too
        raise KeyboardInterrupt("SIGTERM")

    before = signal.signal(signal.SIGTERM, stop)
    code, loop = EXIT_DONE, None
    try:
        with PolicyClient(args.server, token_file=args.token_file, reconnect=args.reconnect,
                          timeout=args.reply_timeout) as client:
            loop = RobotLoop(robot, client, _loop_config(args, realtime))
            _say(f"roboloop robot: envelope: {loop.envelope.describe()}")

            def on_tick(tick: int, action: dict) -> None:
                if getattr(robot, "episode_ended", False):
                    loop.reset()

            loop.run(on_tick)
    except KeyboardInterrupt:
        code = EXIT_STOPPED
    except ServerLostError as e:
        _say(f"roboloop robot: stopped, holding the arm where it is: {e}")
        code = EXIT_SERVER_LOST
    except RobotFault as e:
        _say(f"roboloop robot: stopped: {e}")
        code = EXIT_ROBOT_FAULT
    finally:
        _let_go(robot, loop, operator=code in (EXIT_DONE, EXIT_STOPPED))
        signal.signal(signal.SIGTERM, before)
    if loop is not None:
        out = {"robot": args.robot_type, "exit": code, **loop.stats.summary()}
        if args.robot_type == "sim":
            eps = robot.episodes  # type: ignore[attr-defined]
            out |= {"task": args.task, "episodes": len(eps), "successes": sum(e["success"] for e in eps)}
        print(json.dumps(out))
    return code


def _make_robot(args: argparse.Namespace):
    """(the robot, whether the loop keeps real time): LeRobot's robot class, or a task's simulator."""
    if args.robot_type == "sim":
        from roboloop.serving.sim_robot import SimRobot

        return SimRobot.make(args.task), False  # the simulator keeps its own time
    if not args.robot_port:
        raise ValueError(f"--robot.type {args.robot_type} needs --robot.port (the servo bus, e.g. /dev/ttyACM0)")
    return lerobot_robot(args), True


def _let_go(robot, loop, operator: bool) -> None:
    """Disconnect the robot. On the operator's stop (or the planned end) the arm is brought to rest first and the
    robot's own setting decides its torque; after a fault it is left holding its present position with torque on
    (LeRobot's default turns torque off on disconnect: the arm would drop mid-motion)."""
    config = getattr(robot, "config", None)
    try:
        if loop is not None:
            loop.rest() if operator else loop.rest(ticks=1)
    except Exception as e:  # noqa: BLE001 - a robot that cannot even hold: disconnect as it can
        _say(f"roboloop robot: could not hold the arm before disconnecting ({type(e).__name__}: {e})")
    if not operator and config is not None and getattr(config, "disable_torque_on_disconnect", False):
        config.disable_torque_on_disconnect = False
        _say("roboloop robot: torque left on: the arm holds its present position")
    robot.disconnect()
