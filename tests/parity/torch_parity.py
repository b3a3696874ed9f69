#!/usr/bin/env python3
"""Model parity: the same weights and input through torchvision's inception_v3 (PyTorch) and through
`stepbench check`, in eval and train mode, NCHW and NHWC. Compares logits, aux logits, the loss and
every parameter gradient by max|a - b| / max|b| per tensor.

Exit 0 on agreement, 1 on a mismatch, 77 (skip) when PyTorch or torchvision is missing.
Also usable by hand to check a user's own weights: see README ("Checking numerics")."""
import argparse, json, os, struct, subprocess, sys, tempfile

try:
    import numpy as np
    import torch
    import torchvision
except ImportError as e:  # skipped, with the reason
    print(f"SKIP: {e}; install python3-torch and python3-torchvision")
    sys.exit(77)


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().numpy())
        dt = {np.dtype("float32"): "F32", np.dtype("int64"): "I64"}[a.dtype]
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        b, e = m["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(m["shape"])
    return out


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stepbench", required=True)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=299)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--formats", default="nchw,nhwc")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    model = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=True)
    # non-trivial BN buffers and affine parameters, so eval mode tests the running statistics
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.8, 1.2)
                m.bias.uniform_(-0.1, 0.1)
    n, s = args.batch, args.image_size
    x = torch.randn(n, 3, s, s)
    y = torch.randint(0, 1000, (n,))

    tmp = tempfile.mkdtemp(prefix="stepbench-parity-")
    wpath = os.path.join(tmp, "w.safetensors")
    write_safetensors(wpath, model.state_dict())
    np.save(os.path.join(tmp, "x.npy"), x.numpy())
    np.save(os.path.join(tmp, "y.npy"), y.numpy())

    model.eval()
    with torch.no_grad():
        ref_eval = model(x)
    model.train()
    model.dropout = torch.nn.Identity()  # stepbench check runs train mode without dropout by default
    model.zero_grad()
    out = model(x)
    ce = torch.nn.functional.cross_entropy
    loss = ce(out.logits, y) + 0.4 * ce(out.aux_logits, y)
    loss.backward()
    grads = {k: p.grad.numpy() for k, p in model.named_parameters()}

    worst, failed = {}, []

    def record(kind, name, err):
        worst[kind] = max(worst.get(kind, (0.0, ""))[0], err), name if err >= worst.get(kind, (0.0, ""))[0] else worst[kind][1]
        if not err <= args.tol:
            failed.append(f"{name}: {err:.3g}")
        if os.environ.get("PARITY_VERBOSE"): print(f"{name} {err:.3g}")

    for fmt in args.formats.split(","):
        for mode in ("eval", "train"):
            opath = os.path.join(tmp, f"{fmt}-{mode}.safetensors")
            cmd = [args.stepbench, "check", "--backend", "cpu", "--weights", wpath, "--input",
                   os.path.join(tmp, "x.npy"), "--labels", os.path.join(tmp, "y.npy"), "--mode", mode,
                   "--format", fmt, "--output", opath]
            subprocess.run(cmd, check=True)
            got = read_safetensors(opath)
            if mode == "eval":
                record("logits (eval)", f"{fmt}/eval/logits", rel(got["logits"], ref_eval.numpy()))
                continue
            record("logits (train)", f"{fmt}/train/logits", rel(got["logits"], out.logits.detach().numpy()))
            record("aux_logits", f"{fmt}/train/aux_logits", rel(got["aux_logits"], out.aux_logits.detach().numpy()))
            record("loss", f"{fmt}/train/loss", rel(got["loss"], loss.detach().numpy()))
            missing = set(grads) - set(got)
            if missing:
                failed.append(f"{fmt}: gradients missing for {sorted(missing)[:3]}...")
            for k, g in grads.items():
                if k in got:
                    record("gradients", f"{fmt}/grad/{k}", rel(got[k], g))

    print(f"parity vs torchvision {torchvision.__version__} (PyTorch {torch.__version__}), batch {n}, {s}x{s}, "
          f"metric max|a-b|/max|b| per tensor, tolerance {args.tol:g}")
    for kind, (err, name) in worst.items():
        print(f"  {kind:<16} worst {err:.3e}  ({name})")
    if failed:
        print("MISMATCH:\n  " + "\n  ".join(failed[:20]))
        return 1
    print("parity: all tensors agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
