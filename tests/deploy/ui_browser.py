"""The browser half of tests/deploy/test_ui.py, run as its own process (`python -m tests.deploy.ui_browser PHASE
...`) so that the test can kill it, its chromedriver and every Chromium renderer with one signal to their process
group whatever they are doing. Exit 0: the phase saw what it had to; any failure: a traceback, a screenshot at
`--shot`, exit 1.

  submit --ui URL --deployment ID   log in, check the `evaluate` form (fields, choices), fill it, submit it
  check  --ui URL --run ID          log in, open the run's page: the report artifact's plot loads, its video plays
  form   --ui URL --deployment ID   log in, open a closed-loop deployment's run form: the settings people change
                                    at the top, few inputs, a page that fits a screen (printed as JSON)

Credentials come from $ROBOLOOP_UI_AUTH ("user:password")."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time


def headless_shell() -> str | None:
    """The headless shell's executable itself. Debian's /usr/bin/chromium-headless-shell is a `sh` script that
    runs the binary as its child (no `exec`): chromedriver's quit then ends the script only, and the browser,
    in a session of its own, lives on under init (seen: every phase left 6 processes behind)."""
    for path in ("/usr/lib/chromium/chromium-headless-shell", shutil.which("chromium-headless-shell")):
        if path and os.path.isfile(path):
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    return path
    return None


def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium_bin, driver = headless_shell(), shutil.which("chromedriver")
    assert chromium_bin and driver, "Chromium's headless shell and its driver are missing: `make install` " \
                                    "installs Debian's chromium-headless-shell and chromium-driver"
    opts = webdriver.ChromeOptions()
    for arg in ("--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,2200",
                "--autoplay-policy=no-user-gesture-required", "--disable-extensions", "--mute-audio"):
        opts.add_argument(arg)
    opts.binary_location = chromium_bin
    # return from a navigation at DOMContentLoaded: the flow-run page once never finished "loading" (its live
    # requests kept it busy); every step below waits for its elements anyway
    opts.page_load_strategy = "eager"
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.implicitly_wait(0)
    d.set_page_load_timeout(90)
    d.set_script_timeout(30)
    d.command_executor.client_config.timeout = 90  # read per request: one WebDriver call waits at most 90 s
    return d


def until(fn, timeout: float = 30, what: str = ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def login(d, ui: str, auth: str) -> None:
    from selenium.webdriver.common.by import By

    d.get(f"{ui}/dashboard")
    box = until(lambda: d.find_elements(By.CSS_SELECTOR, "input[type=password]"), 30, "the login form")[0]
    box.send_keys(auth)
    d.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(lambda: "/login" not in d.current_url, 30, "the login to succeed")


def field(d, label: str):
    from selenium.webdriver.common.by import By

    return d.find_element(By.XPATH, f"//label[starts-with(normalize-space(.), '{label}')]/following::*"
                                    "[self::input or self::select or self::textarea][1]")


def put(d, label: str, value: str) -> None:
    """Type `value` into the field labelled `label` and see that it holds it. Prefect's form re-renders a field
    as it empties; keys typed meanwhile are lost (CI once submitted "pert" for "expert"), so it types again
    until the field reads back what was typed."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.keys import Keys

    seen = None
    for _ in range(5):
        with contextlib.suppress(StaleElementReferenceException):
            el = field(d, label)
            el.send_keys(Keys.CONTROL, "a")
            el.send_keys(Keys.DELETE)
            time.sleep(0.3)  # let the emptied field settle before typing
            el.send_keys(value)
            time.sleep(0.3)
            seen = field(d, label).get_attribute("value")
            if seen == value:
                return
    raise AssertionError(f"the {label} field holds {seen!r} after typing {value!r} five times")


def submit(d, ui: str, deployment: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d.get(f"{ui}/deployments/deployment/{deployment}/run")
    until(lambda: d.find_elements(By.TAG_NAME, "textarea"), 30, "the evaluate form")
    want = {"Policy", "Task", "Episodes", "Num Envs", "Device", "Seed", "Execute Steps", "Videos", "Against", "Margin"}

    def labels() -> list[str]:
        return [e.text.split(" (")[0] for e in d.find_elements(By.TAG_NAME, "label")]

    # the textarea can be there before every label has its text (CI read ['', '', '', 'Eval', 'Task', ...] once)
    with contextlib.suppress(AssertionError):
        until(lambda: want <= set(labels()), 30, "the form's labels")
    shown = labels()
    assert want <= set(shown), shown
    assert not {"Stop Against", "Output Dir", "Save Rollouts", "Policy Md5"} & set(shown), shown
    tasks = [o.text for o in Select(field(d, "Task")).options]
    assert {"Roboloop-Reach-Color-v0", "Roboloop-Reach-Color-Vision-v0"} <= set(tasks), tasks  # a choice

    typed = {"Policy": "expert", "Episodes": "6", "Num Envs": "6", "Videos": "1"}
    for label, value in typed.items():
        put(d, label, value)
    held = {label: field(d, label).get_attribute("value") for label in typed}  # none undone by a later re-render
    assert held == typed, held
    send(d)


def error_toasts(d) -> list[str]:
    """The text of every toast with an error icon (a success toast has its own icon)."""
    from selenium.webdriver.common.by import By

    cards = d.find_elements(By.XPATH, "//*[contains(@class, 'p-toast__card ') or @class='p-toast__card']"
                                      "[.//*[contains(@class, 'p-toast__icon--error')]]")
    return list(dict.fromkeys(c.text.strip().removesuffix("Close").strip() or "(an error toast without text)"
                              for c in cards))


def send(d, clicks: int = 3, wait_s: float = 60) -> None:
    """Click the form's submit button until the UI shows it created the run. Prefect's run form, once the
    server has created the run, shows a success toast and leaves for the deployment's page; when the request
    fails (CI's loaded SQLite answers 503 now and then) it shows an error toast and stays, and nothing was
    created, so clicking again cannot make a second run. Neither within `wait_s`: fail with what the page
    shows (CI once waited 90 s after a click for a run that never came and could not say why)."""
    from selenium.webdriver.common.by import By

    seen: list[str] = []
    for n in range(1, clicks + 1):
        d.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        deadline = time.time() + wait_s
        while time.time() < deadline:
            if not d.current_url.rstrip("/").endswith("/run"):
                return
            errors = error_toasts(d)
            if errors:
                print(f"submit: click {n} answered {errors}; clicking again", file=sys.stderr)
                seen += [e for e in errors if e not in seen]
                for close in d.find_elements(By.CSS_SELECTOR, ".p-toast__close-btn"):
                    with contextlib.suppress(Exception):
                        close.click()
                time.sleep(2)
                break
            time.sleep(0.5)
        else:
            page = d.find_element(By.TAG_NAME, "body").text[-1500:]
            raise AssertionError(f"the form was not sent {wait_s:.0f} s after click {n} (toasts {seen}); "
                                 f"the page reads:\n{page}")
    raise AssertionError(f"the form was refused {clicks} times: {seen}")


def check(d, ui: str, run: str) -> None:
    from selenium.webdriver.common.by import By

    d.get(f"{ui}/runs/flow-run/{run}")
    tab = until(lambda: [t for t in d.find_elements(By.CSS_SELECTOR, "li.p-tab") if t.text.strip() == "Artifacts"],
                30, "the Artifacts tab")[0]
    tab.click()
    card = until(lambda: [c for c in d.find_elements(By.XPATH, "//*[contains(text(), '-report')]")], 30,
                 "the report artifact")[0]
    card.click()
    imgs = until(lambda: d.execute_script("return Array.from(document.images).filter(i => i.complete && "
                                          "i.naturalWidth > 0 && i.src.startsWith('data:image/png')).length"),
                 30, "the evaluation plot to load")
    assert imgs >= 1
    video = until(lambda: d.execute_script("const v = document.querySelector('video'); "
                                           "return v && v.readyState >= 1 && v.duration > 0 && [v.duration]"),
                  30, "a playable rollout video")
    assert video[0] > 0.3  # seconds of rollout (the expert needs about 25-75 steps at 30 fps)
    d.execute_script("document.querySelector('video').play()")
    until(lambda: d.execute_script("return document.querySelector('video').currentTime > 0.1"), 20,
          "the video to play")


def loop_form(d, ui: str, deployment: str) -> None:
    """The closed-loop form as a person meets it: its labels in order, how many inputs, how tall the page is."""
    import json

    from selenium.webdriver.common.by import By

    d.get(f"{ui}/deployments/deployment/{deployment}/run")
    want = ["preset", "source", "policy", "steps", "episodes", "margin", "evaluation", "overrides", "cfg"]

    def labels() -> list[str]:
        return [t for e in d.find_elements(By.TAG_NAME, "label") if (t := e.text.split(" (")[0].strip())]

    with contextlib.suppress(AssertionError):
        until(lambda: set(want) <= set(labels()), 30, "the form's labels")
    time.sleep(2)  # a late re-render
    shown = labels()
    inputs = d.execute_script("return document.querySelectorAll('input, select, textarea').length")
    bottom = d.execute_script("const b = Array.from(document.querySelectorAll('button')).find(x => "
                              "x.textContent.trim() === 'Submit'); return b && Math.round(b.getBoundingClientRect()"
                              ".bottom + window.scrollY)")
    print(json.dumps({"labels": shown, "inputs": inputs, "submit_button_at_px": bottom}))
    assert [w for w in shown if w in want] == want, shown  # the settings people change first, advanced last
    assert inputs <= 15 and bottom and bottom <= 2000, (inputs, bottom, shown)  # was 102 inputs, 12,300 px


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["submit", "check", "form"])
    ap.add_argument("--ui", required=True)
    ap.add_argument("--deployment")
    ap.add_argument("--run")
    ap.add_argument("--shot", required=True)
    a = ap.parse_args(argv)
    d = chromium()
    try:
        login(d, a.ui, os.environ["ROBOLOOP_UI_AUTH"])
        if a.phase == "submit":
            submit(d, a.ui, a.deployment)
        elif a.phase == "form":
            loop_form(d, a.ui, a.deployment)
        else:
            check(d, a.ui, a.run)
        print(f"{a.phase}: ok")
        return 0
    except Exception:
        with contextlib.suppress(Exception):
            d.save_screenshot(a.shot)
            print(f"screenshot of the failure: {a.shot} (page {d.current_url})", file=sys.stderr)
        raise
    finally:
        with contextlib.suppress(Exception):
            d.quit()


if __name__ == "__main__":
    sys.exit(main())
