"""Drives a running pi0-serve with openpi's own client (openpi-client==0.1.2), for tests/unit/serve/test_server.cpp.

For each case it builds a robot observation (LIBERO, ALOHA or raw keys), sends it with
openpi_client.websocket_client_policy.WebsocketClientPolicy, checks the answer's structure, and writes
  <out>/obs_<i>.safetensors     the same observation in pi0-infer's keys (converted here, independently of the server)
  <out>/prompt_<i>.txt          its prompt
  <out>/actions_<i>.safetensors the server's actions
so the C++ test can run pi0-infer on them and compare. It also checks /healthz, the API key (when given), the
metadata keys given with --expect-metadata, that the prompt may come as str, bytes or a numpy text array (as openpi's
transforms accept it) with the same answer, that a bad observation raises the server's text in the client while the
server keeps serving, and with --oversize-mb that a frame over the server's limit raises its text too.
Exit code 0 = every check passed; the first failed check is printed.
"""

import argparse
import json
import pathlib
import struct
import sys
import urllib.request

import numpy as np
from openpi_client import websocket_client_policy

ACTION_DIMS = {"libero": 7, "aloha": 14, "droid": 8}


def save_safetensors(path, tensors):
    """Writes a minimal safetensors file (no dependency on the safetensors package)."""
    names = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.bool_): "BOOL"}
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        data = array.tobytes()
        header[name] = {"dtype": names[array.dtype], "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def to_uint8_hwc(image, chw):
    """openpi's _parse_image: float -> (255 * x).astype(uint8), CHW -> HWC."""
    if np.issubdtype(image.dtype, np.floating):
        image = (255 * image).astype(np.uint8)
    return np.transpose(image, (1, 2, 0)) if chw else image


def make_case(robot, i, rng):
    """(observation for the server, the same observation in pi0-infer's keys [1,...], prompt)."""
    prompt = ["pick up the red block", "fold the towel", "open the drawer"][i % 3]
    if robot == "libero":
        image = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        wrist = rng.integers(0, 256, size=(24, 40, 3), dtype=np.uint8)
        state = rng.normal(size=8)
        sent_image, chw = image, False
        if i == 1:
            sent_image, chw = np.ascontiguousarray(np.transpose(image, (2, 0, 1))), True
        elif i == 2:
            sent_image = image.astype(np.float32) / 255.0
        obs = {"observation/image": sent_image, "observation/wrist_image": wrist, "observation/state": state, "prompt": prompt}
        model = {"image/base_0_rgb": to_uint8_hwc(sent_image, chw)[None], "image/left_wrist_0_rgb": wrist[None],
                 "state": state[None]}
    elif robot == "aloha":
        state = rng.normal(size=14) * 0.5
        images = {"cam_high": rng.integers(0, 256, size=(3, 32, 32), dtype=np.uint8),
                  "cam_low": rng.integers(0, 256, size=(3, 32, 32), dtype=np.uint8),
                  "cam_left_wrist": rng.integers(0, 256, size=(3, 24, 24), dtype=np.uint8)}
        if i == 1:
            images["cam_right_wrist"] = rng.integers(0, 256, size=(3, 20, 30), dtype=np.uint8)
        if i == 2:
            images["cam_high"] = rng.random(size=(3, 32, 32)).astype(np.float32)
        obs = {"state": state, "images": images, "prompt": prompt}
        model = {"image/base_0_rgb": to_uint8_hwc(images["cam_high"], True)[None],
                 "image/left_wrist_0_rgb": to_uint8_hwc(images["cam_left_wrist"], True)[None], "state": state[None]}
        if "cam_right_wrist" in images:
            model["image/right_wrist_0_rgb"] = to_uint8_hwc(images["cam_right_wrist"], True)[None]
    elif robot == "droid":
        exterior = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
        wrist = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        joints, gripper = rng.normal(size=7), rng.random(size=1)
        sent, chw = exterior, False
        if i == 1:
            sent, chw = np.ascontiguousarray(np.transpose(exterior, (2, 0, 1))), True
        elif i == 2:
            sent = exterior.astype(np.float64) / 255.0
        obs = {"observation/exterior_image_1_left": sent, "observation/wrist_image_left": wrist,
               "observation/joint_position": joints, "observation/gripper_position": gripper, "prompt": prompt}
        model = {"image/base_0_rgb": to_uint8_hwc(sent, chw)[None], "image/left_wrist_0_rgb": wrist[None],
                 "state": np.concatenate([joints, gripper])[None]}
    else:  # raw: the model's own keys, unbatched
        base = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
        wrist = (rng.random(size=(28, 28, 3)) * 2 - 1).astype(np.float32)
        state = rng.normal(size=8).astype(np.float32)
        mask = np.True_ if i != 2 else np.False_
        obs = {"image/base_0_rgb": base, "image/left_wrist_0_rgb": wrist, "image_mask/left_wrist_0_rgb": mask,
               "state": state, "prompt": prompt}
        model = {"image/base_0_rgb": base[None], "image/left_wrist_0_rgb": wrist[None],
                 "image_mask/left_wrist_0_rgb": np.array([bool(mask)]), "state": state[None]}
    return obs, model, prompt


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--robot", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--cases", type=int, default=3)
    p.add_argument("--api-key", default=None)
    p.add_argument("--raw-dims", type=int, default=8)
    p.add_argument("--expect-metadata", default="{}", help="JSON map: keys the metadata must hold (null: must lack)")
    p.add_argument("--oversize-mb", type=int, default=0, help="also send a frame of this many MiB, expecting a refusal")
    a = p.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"

    with urllib.request.urlopen(f"http://{host}:{a.port}/healthz", timeout=10) as r:
        check(r.status == 200 and r.read() == b"OK\n", "/healthz answers 200 OK")

    if a.api_key:
        for wrong in (None, "not-the-key"):
            try:
                websocket_client_policy.WebsocketClientPolicy(host, a.port, api_key=wrong)
                check(False, f"a client with api_key={wrong!r} is refused")
            except Exception as e:  # websockets.exceptions.InvalidStatus: HTTP 401
                check("401" in str(e), f"refusal is HTTP 401 (got {e!r})")

    client = websocket_client_policy.WebsocketClientPolicy(host, a.port, api_key=a.api_key)
    md = client.get_server_metadata()
    check(md.get("robot") == a.robot, f"metadata robot == {a.robot} (got {md})")
    check(md.get("model_type") == "pi05", f"metadata model_type (got {md})")
    dims = ACTION_DIMS.get(a.robot, a.raw_dims)
    check(md.get("action_dim") == dims, f"metadata action_dim == {dims} (got {md})")
    horizon = md.get("action_horizon")
    check(isinstance(horizon, int) and horizon > 0, f"metadata action_horizon (got {md})")
    check(isinstance(md.get("config_id"), str) and md["config_id"], f"metadata config_id (got {md})")
    for key, want in json.loads(a.expect_metadata).items():
        if want is None:
            check(key not in md, f"metadata has no {key!r} (got {md})")
        else:
            check(key in md and md[key] == want, f"metadata {key!r} == {want!r} (got {md.get(key)!r})")

    rng = np.random.default_rng(7)
    for i in range(a.cases):
        obs, model, prompt = make_case(a.robot, i, rng)
        result = client.infer(obs)
        actions = result.get("actions")
        check(isinstance(actions, np.ndarray) and actions.dtype == np.float32, f"case {i}: actions is a float32 ndarray")
        check(actions.shape == (horizon, dims), f"case {i}: actions shape {actions.shape} == {(horizon, dims)}")
        check(np.isfinite(actions).all(), f"case {i}: actions are finite")
        check(result["policy_timing"]["infer_ms"] > 0, f"case {i}: policy_timing.infer_ms")
        check(result["server_timing"]["infer_ms"] >= result["policy_timing"]["infer_ms"], f"case {i}: server_timing.infer_ms")
        check(("prev_total_ms" in result["server_timing"]) == (i > 0), f"case {i}: prev_total_ms from the second request on")
        save_safetensors(out / f"obs_{i}.safetensors", model)
        save_safetensors(out / f"actions_{i}.safetensors", {"actions": actions})
        (out / f"prompt_{i}.txt").write_text(prompt)

    # The prompt as openpi's transforms also take it: bytes (decoded), numpy text arrays (.item()) of str or bytes.
    obs, _, prompt = make_case(a.robot, 0, np.random.default_rng(7))
    first = np.frombuffer((out / "actions_0.safetensors").read_bytes()[-actions.nbytes:], dtype=np.float32)
    for form in (prompt.encode(), np.array(prompt), np.array([prompt]), np.array(prompt.encode()), np.str_(prompt)):
        got = client.infer({**obs, "prompt": form})["actions"]
        check(np.array_equal(got.reshape(-1), first), f"prompt as {type(form).__name__} {getattr(form, 'dtype', '')} "
              f"{getattr(form, 'shape', '')}: the answer of the str prompt")

    if a.oversize_mb:
        # Over the server's --max-frame-mb: the client raises the server's explanation, not a bare closed connection.
        big = {**obs, "padding": np.zeros(a.oversize_mb << 20, dtype=np.uint8)}
        try:
            client.infer(big)
            check(False, f"a frame of {a.oversize_mb} MiB is refused")
        except RuntimeError as e:
            check("Error in inference server" in str(e) and "frame larger than" in str(e), f"oversize text reaches the client (got {e!r})")
        client = websocket_client_policy.WebsocketClientPolicy(host, a.port, api_key=a.api_key)

    # A bad observation: the client raises the server's one-line text; the server keeps serving.
    try:
        client.infer({"prompt": "no state, no images"})
        check(False, "an observation without its keys is refused")
    except RuntimeError as e:
        check("Error in inference server" in str(e) and "missing key" in str(e), f"error text reaches the client (got {e})")
    client = websocket_client_policy.WebsocketClientPolicy(host, a.port, api_key=a.api_key)
    obs, _, _ = make_case(a.robot, 0, np.random.default_rng(7))
    again = client.infer(obs)["actions"]
    first = np.frombuffer((out / "actions_0.safetensors").read_bytes()[-again.nbytes:], dtype=np.float32).reshape(again.shape)
    check(np.array_equal(again, first), "the same observation after an error gets the same answer")
    print(f"ok: {a.cases} cases, robot {a.robot}, metadata {md}")


if __name__ == "__main__":
    main()
