"""Real-time chunking (RTC) from the robot's side, against pi0-serve (docs/serving.md, "Real-time chunking").

  pip install openpi-client numpy
  python examples/rtc_client.py --host 127.0.0.1 --port 8000 --robot aloha --hz 50 --steps 500

openpi's ActionChunkBroker executes a whole chunk, then waits for the next one. Here the robot never waits: it executes
one queued action per control tick, and when the queue runs low (--threshold rows) a background thread asks for the
next chunk, sending the rows still queued (`prev_action_chunk`, as the server returned them, row 0 next) and how many
of them will execute before the answer arrives (`inference_delay` d = ceil(recent latency x rate)). The server makes
the new chunk continue those rows, so when it arrives the robot drops the rows that executed meanwhile and goes on
from the same row of the new chunk without a jump. Without RTC on the server it falls back to plain chunking.

The "robot" here is simulated: random camera images in the keys of each --robot profile, and a state that follows
the executed actions where they are joint positions. Replace make_observation() and the execute step with yours.
"""

import argparse
import collections
import json
import math
import threading
import time

import numpy as np
from openpi_client import websocket_client_policy

STATE_DIMS = {"libero": 8, "aloha": 14, "droid": 8, "raw": 8}


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
    except Exception as e:  # re-raised by the control loop
        box["error"] = e
    box["latency"] = time.monotonic() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--robot", default="aloha", choices=sorted(STATE_DIMS))
    p.add_argument("--prompt", default="pick up the red block")
    p.add_argument("--hz", type=float, default=50.0, help="control rate: actions executed per second")
    p.add_argument("--steps", type=int, default=500, help="control steps to run")
    p.add_argument("--threshold", type=int, default=None, help="ask for the next chunk at this many queued rows "
                   "(default: half the action horizon)")
    p.add_argument("--execute-horizon", type=int, default=None, help="end row of the guided soft region "
                   "(default: the server's, all rows sent)")
    p.add_argument("--json", default=None, help="write a summary here")
    a = p.parse_args()

    client = websocket_client_policy.WebsocketClientPolicy(a.host, a.port)
    meta = client.get_server_metadata()
    horizon = int(meta["action_horizon"])
    rtc = meta.get("rtc") or {}
    use_rtc = bool(rtc.get("modes"))
    max_delay = horizon - 1  # the server needs at least one new row
    if rtc.get("default") == "trained":  # a server forced to trained mode refuses longer delays
        max_delay = min(max_delay, int(rtc["trained_max_delay"]))
    # Plain chunking (openpi's broker): execute the whole chunk, then wait for the next.
    threshold = min(horizon // 2 if a.threshold is None else a.threshold, horizon - 1) if use_rtc else 0
    print(f"server: horizon {horizon}, rtc {json.dumps(rtc) if use_rtc else 'not offered: plain chunking'}")

    rng = np.random.default_rng(0)
    state = np.zeros(STATE_DIMS[a.robot])
    latencies = collections.deque(maxlen=10)  # the delay estimate is the largest of the last 10 (the RTC paper's)
    summary = {"rtc": use_rtc, "horizon": horizon, "threshold": threshold, "delays": [], "rows_sent": [],
               "executed_during": [], "latencies_ms": [], "seam_jumps": [], "replies_rtc": []}

    def record(reply, latency):
        latencies.append(latency)
        summary["latencies_ms"].append(1000 * latency)
        summary["replies_rtc"].append(reply.get("rtc"))

    box = {}
    request(client, make_observation(a.robot, state, rng, a.prompt), box)  # the first chunk: the robot waits for it
    record(box["reply"], box["latency"])
    queue = np.asarray(box["reply"]["actions"])  # rows still to execute, row 0 next, as the server returned them
    executed = []  # the simulated robot: every action it executed
    pending, stalls = None, 0
    period, next_tick = 1.0 / a.hz, time.monotonic()
    for _ in range(a.steps):
        # A finished request: drop the rows that executed while it ran, continue at that row of the new chunk.
        if pending is not None and "latency" in pending:
            if "error" in pending:
                raise pending["error"]
            reply, ran = pending["reply"], pending["ran"]
            record(reply, pending["latency"])
            chunk = np.asarray(reply["actions"])
            queue = chunk[ran:]
            jump = float(np.abs(queue[0] - executed[-1]).max()) if len(queue) and executed else None
            summary["executed_during"].append(ran)
            summary["seam_jumps"].append(jump)
            print(f"chunk {len(summary['latencies_ms'])}: latency {1000 * pending['latency']:.1f} ms, "
                  f"d {pending['delay']}, executed meanwhile {ran}, seam jump {jump}, rtc {reply.get('rtc')}")
            pending = None
        # The queue runs low: ask for the next chunk in the background.
        if pending is None and len(queue) <= threshold:
            obs = make_observation(a.robot, state, rng, a.prompt)
            delay = 0
            if use_rtc:
                delay = min(math.ceil(max(latencies) * a.hz), len(queue), max_delay)
                obs["prev_action_chunk"] = np.array(queue, dtype=np.float32)
                obs["inference_delay"] = delay
                if a.execute_horizon is not None:
                    obs["execute_horizon"] = min(max(a.execute_horizon, delay), horizon)
                summary["delays"].append(delay)
                summary["rows_sent"].append(len(queue))
            pending = {"ran": 0, "delay": delay}
            threading.Thread(target=request, args=(client, obs, pending), daemon=True).start()
        # Execute one action (the robot holds still when the queue is empty).
        if len(queue):
            action, queue = queue[0], queue[1:]
            executed.append(action)
            if len(action) == len(state):  # joint-position actions: the simulated robot reaches them
                state = action.astype(np.float64)
            if pending is not None:
                pending["ran"] += 1
        else:
            stalls += 1
        next_tick = max(next_tick + period, time.monotonic())
        time.sleep(max(0.0, next_tick - time.monotonic()))
    if pending is not None:  # let the last request finish before the connection goes
        while "latency" not in pending:
            time.sleep(0.001)

    replies = summary["replies_rtc"]
    summary.update(chunks=len(replies), steps=a.steps, executed=len(executed), stalls=stalls,
                   every_reply_rtc=use_rtc and len(replies) > 1 and all(r is not None for r in replies[1:]))
    jumps = [j for j in summary["seam_jumps"] if j is not None]
    print(f"{len(replies)} chunks, {len(executed)} actions, {stalls} stalled ticks, "
          f"largest seam jump {max(jumps) if jumps else None}, every reply with rtc: {summary['every_reply_rtc']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
