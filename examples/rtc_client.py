"""Real-time chunking (RTC) from the robot's side, against pi0-serve (docs/serving.md, "Real-time chunking").

  python3 -m venv rtc_venv    # Python 3.9 to 3.12: openpi-client needs numpy < 2, which has no wheels for 3.13
  rtc_venv/bin/pip install openpi-client==0.1.2 typing_extensions==4.16.0 numpy==1.26.4
  rtc_venv/bin/python examples/rtc_client.py --host 127.0.0.1 --port 8000 --hz 50 --steps 500

(openpi-client 0.1.2 imports typing_extensions without declaring it, so pip alone does not install it.)

openpi's ActionChunkBroker executes a whole chunk, then waits for the next one. Here the robot never waits: it executes
one queued action per control tick, and when the queue runs low (--threshold rows) a background thread asks for the
next chunk, sending the rows still queued (`prev_action_chunk`, as the server returned them, row 0 next) and how many
of them will execute before the answer arrives (`inference_delay` d = ceil(recent latency x rate)). The server makes
the new chunk continue those rows, so when it arrives the robot drops the rows that executed meanwhile and goes on
from the same row of the new chunk without a jump. Without RTC on the server it falls back to plain chunking.

What it prints per chunk shows whether that worked: the seam jump (the largest |first new action - last executed
action| over the action dims, in the robot's action units) next to the per-tick step of the executed actions (the
same measure between consecutive actions of one chunk): a seam jump about equal to the step is a smooth hand-over,
many times the step is a jerk. "late" marks an answer that came after more rows executed than the d it was sent
with (the seam then falls on a row the server did not hold to the sent ones: raise d's margin or the threshold), and
"stalled" counts ticks the robot held still with an empty queue (the threshold is too low for the latency).

The "robot" here is simulated: random camera images in the keys of the server's --robot profile (read from its
metadata; --robot overrides), and a state that follows the executed actions where they are joint positions. Replace
make_observation() and the execute step with yours.

Exit codes: 0 done; 1 the server refused a request (its error line is printed) or the connection failed.
"""

import argparse
import collections
import json
import math
import sys
import threading
import time

import numpy as np
from openpi_client import websocket_client_policy

STATE_DIMS = {"libero": 8, "aloha": 14, "droid": 8, "raw": 8}
SERVER_ERROR = "Error in inference server:"  # how openpi-client raises the server's error text frame


def make_observation(robot, state, rng, prompt):
    """A stand-in for the cameras and joints, in the observation keys of pi0-serve's --robot profiles."""
    def image(chw=False):
        return rng.integers(0, 256, size=(3, 224, 224) if chw else (224, 224, 3), dtype=np.uint8)

    if robot == "libero":
        return {"observation/image": image(), "observation/wrist_image": image(), "observation/state": state,
                "prompt": prompt}
    if robot == "aloha":
        cams = ("cam_high", "cam_left_wrist", "cam_right_wrist")
        return {"images": {c: image(chw=True) for c in cams}, "state": state, "prompt": prompt}
    if robot == "droid":
        return {"observation/exterior_image_1_left": image(), "observation/wrist_image_left": image(),
                "observation/joint_position": state[:7], "observation/gripper_position": state[7:], "prompt": prompt}
    return {"image/base_0_rgb": image(), "image/left_wrist_0_rgb": image(), "state": state.astype(np.float32),
            "prompt": prompt}


def request(client, obs, box):
    """Runs in the background thread: one inference, timed."""
    start = time.monotonic()
    try:
        box["reply"] = client.infer(obs)
    except Exception as e:  # reported by the control loop
        box["error"] = e
    box["latency"] = time.monotonic() - start


def fail(error):
    """The server's error line (a text frame, then close 1011) or the connection's failure; exit 1."""
    text = str(error)
    if isinstance(error, RuntimeError) and text.startswith(SERVER_ERROR):
        print(f"rtc_client: the server refused the request: {text[len(SERVER_ERROR):].strip()}", file=sys.stderr)
    else:
        print(f"rtc_client: the request failed: {type(error).__name__}: {text}", file=sys.stderr)
    sys.exit(1)


def tick_steps(actions):
    """The per-tick step between consecutive actions: the largest |difference| over the action dims."""
    return [float(np.abs(b - a).max()) for a, b in zip(actions, actions[1:])]


def fmt(x):
    return "n/a" if x is None else f"{x:.4g}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--robot", default=None, choices=sorted(STATE_DIMS),
                   help="observation keys to send (default: the server's --robot, from its metadata)")
    p.add_argument("--state-dim", type=int, default=None, help="state dims to send (default: the robot's; raw: 8)")
    p.add_argument("--prompt", default="pick up the red block")
    p.add_argument("--hz", type=float, default=50.0, help="control rate: actions executed per second")
    p.add_argument("--steps", type=int, default=500, help="control steps to run")
    p.add_argument("--threshold", type=int, default=None, help="ask for the next chunk at this many queued rows "
                   "(default: half the action horizon)")
    p.add_argument("--execute-horizon", type=int, default=None, help="end row of the guided soft region "
                   "(default: the server's, all rows sent)")
    p.add_argument("--json", default=None, help="write a summary here")
    a = p.parse_args()

    try:
        client = websocket_client_policy.WebsocketClientPolicy(a.host, a.port)
    except Exception as e:  # refused (HTTP 401/503) or nothing listening
        fail(e)
    meta = client.get_server_metadata()
    robot = a.robot or meta.get("robot")
    if robot not in STATE_DIMS:
        print(f"rtc_client: the server's metadata names no pi0-serve robot (robot: {meta.get('robot')!r}); "
              f"give --robot ({', '.join(sorted(STATE_DIMS))})", file=sys.stderr)
        sys.exit(1)
    if a.robot and meta.get("robot") and a.robot != meta["robot"]:
        print(f"rtc_client: --robot {a.robot}, but the server serves robot {meta['robot']}: expect it to refuse "
              f"the observation", file=sys.stderr)
    if a.state_dim:
        state_dim = a.state_dim
    elif robot == meta.get("robot") and int(meta.get("state_dim") or 0) > 0:
        state_dim = int(meta["state_dim"])  # raw announces 0: any width, the bundle's stats decide
    else:
        state_dim = STATE_DIMS[robot]
    horizon = int(meta["action_horizon"])
    rtc = meta.get("rtc") or {}
    use_rtc = bool(rtc.get("modes"))
    max_delay = horizon - 1  # the server needs at least one new row
    if rtc.get("default") == "trained":  # a server forced to trained mode refuses longer delays
        max_delay = min(max_delay, int(rtc["trained_max_delay"]))
    # Plain chunking (openpi's broker): execute the whole chunk, then wait for the next.
    threshold = min(horizon // 2 if a.threshold is None else a.threshold, horizon - 1) if use_rtc else 0
    print(f"server: robot {meta.get('robot')}, horizon {horizon}, "
          f"rtc {json.dumps(rtc) if use_rtc else 'not offered: plain chunking'}")
    whose = "" if a.robot else " (the server's)"
    print(f"client: robot {robot}{whose}, state dims {state_dim}, {a.hz:g} Hz, "
          f"threshold {threshold} rows; seam jump and per-tick step in the robot's action units "
          f"(largest |difference| over the action dims)")

    rng = np.random.default_rng(0)
    state = np.zeros(state_dim)
    latencies = collections.deque(maxlen=10)  # the delay estimate is the largest of the last 10 (the RTC paper's)
    summary = {"rtc": use_rtc, "robot": robot, "horizon": horizon, "threshold": threshold, "delays": [],
               "rows_sent": [], "executed_during": [], "latencies_ms": [], "seam_jumps": [], "tick_steps": [],
               "late": [], "stalls_per_chunk": [], "replies_rtc": []}

    def record(reply, latency):
        latencies.append(latency)
        summary["latencies_ms"].append(1000 * latency)
        summary["replies_rtc"].append(reply.get("rtc"))

    box = {}
    request(client, make_observation(robot, state, rng, a.prompt), box)  # the first chunk: the robot waits for it
    if "error" in box:
        fail(box["error"])
    record(box["reply"], box["latency"])
    queue = np.asarray(box["reply"]["actions"])  # rows still to execute, row 0 next, as the server returned them
    executed = []  # the simulated robot: every action it executed
    chunk_executed = []  # the actions executed from the current chunk: their steps are the seam's baseline
    all_steps = []  # per-tick steps within chunks, over the run
    pending, stalls = None, 0
    period, next_tick = 1.0 / a.hz, time.monotonic()
    for _ in range(a.steps):
        # A finished request: drop the rows that executed while it ran, continue at that row of the new chunk.
        if pending is not None and "latency" in pending:
            if "error" in pending:
                fail(pending["error"])
            reply, ran = pending["reply"], pending["ran"]
            record(reply, pending["latency"])
            chunk = np.asarray(reply["actions"])
            queue = chunk[ran:]
            jump = float(np.abs(queue[0] - executed[-1]).max()) if len(queue) and executed else None
            steps = tick_steps(chunk_executed)
            step = float(np.median(steps)) if steps else None
            all_steps.extend(steps)
            late = use_rtc and ran > pending["delay"]
            summary["executed_during"].append(ran)
            summary["seam_jumps"].append(jump)
            summary["tick_steps"].append(step)
            summary["late"].append(late)
            summary["stalls_per_chunk"].append(pending["stalls"])
            ratio = f" (x{jump / step:.2g})" if jump is not None and step else ""
            flags = ""
            if late:
                flags += f", LATE: {ran} rows executed meanwhile, d was {pending['delay']}"
            if pending["stalls"]:
                flags += f", STALLED {pending['stalls']} ticks with an empty queue"
            print(f"chunk {len(summary['latencies_ms'])}: latency {1000 * pending['latency']:.1f} ms, "
                  f"d {pending['delay']}, executed meanwhile {ran}, seam jump {fmt(jump)} vs per-tick step "
                  f"{fmt(step)}{ratio}, rtc {reply.get('rtc')}{flags}")
            pending, chunk_executed = None, []
        # The queue runs low: ask for the next chunk in the background.
        if pending is None and len(queue) <= threshold:
            obs = make_observation(robot, state, rng, a.prompt)
            delay = 0
            if use_rtc:
                delay = min(math.ceil(max(latencies) * a.hz), len(queue), max_delay)
                obs["prev_action_chunk"] = np.array(queue, dtype=np.float32)
                obs["inference_delay"] = delay
                if a.execute_horizon is not None:
                    obs["execute_horizon"] = min(max(a.execute_horizon, delay), horizon)
                summary["delays"].append(delay)
                summary["rows_sent"].append(len(queue))
            pending = {"ran": 0, "delay": delay, "stalls": 0}
            threading.Thread(target=request, args=(client, obs, pending), daemon=True).start()
        # Execute one action (the robot holds still when the queue is empty).
        if len(queue):
            action, queue = queue[0], queue[1:]
            executed.append(action)
            chunk_executed.append(action)
            if len(action) == len(state):  # joint-position actions: the simulated robot reaches them
                state = action.astype(np.float64)
            if pending is not None:
                pending["ran"] += 1
        else:
            stalls += 1
            if pending is not None:
                pending["stalls"] += 1
        next_tick = max(next_tick + period, time.monotonic())
        time.sleep(max(0.0, next_tick - time.monotonic()))
    if pending is not None:  # let the last request finish before the connection goes
        while "latency" not in pending:
            time.sleep(0.001)

    replies = summary["replies_rtc"]
    jumps = [j for j in summary["seam_jumps"] if j is not None]
    step = float(np.median(all_steps)) if all_steps else None
    summary.update(chunks=len(replies), steps=a.steps, executed=len(executed), stalls=stalls,
                   median_tick_step=step, late_answers=sum(summary["late"]),
                   every_reply_rtc=use_rtc and len(replies) > 1 and all(r is not None for r in replies[1:]))
    largest = max(jumps) if jumps else None
    ratio = f" (x{largest / step:.2g}; about 1 is smooth)" if largest is not None and step else ""
    print(f"{len(replies)} chunks, {len(executed)} actions, {stalls} stalled ticks, {summary['late_answers']} late "
          f"answers; largest seam jump {fmt(largest)} vs median per-tick step {fmt(step)}{ratio}; "
          f"every reply with rtc: {summary['every_reply_rtc']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
