"""Guided real-time chunking by LeRobot's own code, on a linear velocity field, for tests/unit/model/test_rtc_lerobot.cpp.

  python scripts/rtc_lerobot_reference.py [spec.json] [--out result.json]     (spec on stdin without a file; a JSON
                                                                              list of specs gives a list of results)
  python scripts/rtc_lerobot_reference.py --check                               (imports only; prints the versions)

Spec (JSON): "M" [A][A], "c" [A]: the field v(x, t) = x @ M^T + t * c;  "x0" [B][H][A]: the noise;  "prev" [R][A]: the
previous chunk's left-over rows (model space, row 0 next);  "delay": d;  "execution_horizon": end of the soft region;
"schedule": zeros | ones | linear | exp;  "max_guidance_weight": beta;  "num_steps": n.
Result (JSON): "x" [B][H][A] the sampled chunk, "prefix_weights" [H] and "guidance_weights" [n] as LeRobot's debug
tracker recorded them, "times" [n], and the lerobot and torch versions.

Each step's velocity goes through lerobot.policies.rtc.modeling_rtc.RTCProcessor.denoise_step; the loop around it is
openpi's Euler loop as LeRobot's pi0 sample_actions runs it (time = 1 + step * dt as a Python float, the field's time
a float32 tensor of it, x += dt * v). Venv: scripts/setup_lerobot_check.sh.
"""

import argparse
import importlib.util
import json
import os
import sys
import types

import torch


def import_lerobot_rtc():
    """LeRobot's RTC classes. lerobot/policies/__init__.py imports every policy's configuration (draccus,
    huggingface_hub, ... none of which RTC uses and none of which the --no-deps venv has), so the lerobot.policies
    package is registered without running that file; every module that RTC runs is imported from its own file, as is."""
    spec = importlib.util.find_spec("lerobot")
    if spec is None:
        raise ImportError("no lerobot package (scripts/setup_lerobot_check.sh makes a venv with it)")
    if "lerobot.policies" not in sys.modules:
        policies = types.ModuleType("lerobot.policies")
        policies.__path__ = [os.path.join(os.path.dirname(spec.origin), "policies")]
        sys.modules["lerobot.policies"] = policies
    import lerobot
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from lerobot.policies.rtc.modeling_rtc import RTCProcessor

    return lerobot.__version__, RTCAttentionSchedule, RTCConfig, RTCProcessor


def run(spec):
    version, RTCAttentionSchedule, RTCConfig, RTCProcessor = import_lerobot_rtc()
    f32 = torch.float32
    m = torch.tensor(spec["M"], dtype=f32)
    c = torch.tensor(spec["c"], dtype=f32)
    x = torch.tensor(spec["x0"], dtype=f32)
    batch, n = x.shape[0], int(spec["num_steps"])
    # Batched rows: denoise_step pads a 2-D chunk to batch 1 only, which would not match x for B > 1.
    prev = torch.tensor(spec["prev"], dtype=f32).unsqueeze(0).expand(batch, -1, -1).contiguous()
    config = RTCConfig(enabled=True, prefix_attention_schedule=RTCAttentionSchedule[spec["schedule"].upper()],
                       max_guidance_weight=float(spec["max_guidance_weight"]),
                       execution_horizon=int(spec["execution_horizon"]), debug=True, debug_maxlen=n)
    processor = RTCProcessor(config)
    dt = -1.0 / n
    times = []
    for step in range(n):
        time = 1.0 + step * dt
        time_tensor = torch.tensor(time, dtype=f32).expand(batch)

        def velocity(x_t, t=time_tensor):
            return x_t @ m.T + t[:, None, None] * c

        v = processor.denoise_step(x_t=x, prev_chunk_left_over=prev, inference_delay=int(spec["delay"]), time=time,
                                   original_denoise_step_partial=velocity,
                                   execution_horizon=int(spec["execution_horizon"]))
        x = x + dt * v
        times.append(time)
    steps = processor.get_all_debug_steps()
    assert len(steps) == n, f"the debug tracker kept {len(steps)} steps, expected {n}"
    return {"x": x.tolist(), "prefix_weights": steps[0].weights.reshape(-1).tolist(),
            "guidance_weights": [float(s.guidance_weight) for s in steps], "times": times,
            "lerobot_version": version, "torch_version": torch.__version__}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("spec", nargs="?", help="spec JSON file (default: stdin)")
    p.add_argument("--out", help="result JSON file (default: stdout)")
    p.add_argument("--check", action="store_true", help="only import LeRobot's RTC modules and print the versions")
    a = p.parse_args()
    if a.check:
        version = import_lerobot_rtc()[0]
        print(f"lerobot {version}, torch {torch.__version__}")
        return
    spec = json.load(open(a.spec) if a.spec else sys.stdin)
    text = json.dumps([run(s) for s in spec] if isinstance(spec, list) else run(spec))
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
