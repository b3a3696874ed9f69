#!/usr/bin/env python3
"""The peer: the same training-step phases in PyTorch (Debian's python3-torch, CPU or CUDA), timed the
same way stepbench times them (warm-up, then the median of N timed repetitions), so the two can be
compared as a ratio in the same run. Prints one JSON object: {"phase": median_ms, ...}.

  bench/torch_peer.py --model inception_v3 --batch-size 8 --image-size 299 --format nchw

Exit 77 when torch or torchvision is missing."""
import argparse, json, os, statistics, sys, time

try:
    import torch
    import torchvision
except ImportError as e:
    print(f"SKIP: {e}; install python3-torch and python3-torchvision", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="inception_v3", choices=["inception_v3", "tiny"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=299)
    ap.add_argument("--format", default="nchw", choices=["nchw", "nhwc"])
    ap.add_argument("--aux-logits", default="on", choices=["on", "off"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0: all cores")
    args = ap.parse_args()
    # Debian's torch starts with one thread here; use every core, as stepbench's OpenMP does
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    dev = torch.device(args.device)
    if args.model == "tiny":
        from torch_parity import Tiny  # the same network as src/models/tiny.cpp
        model = Tiny()
    else:
        model = torchvision.models.inception_v3(weights=None, aux_logits=args.aux_logits == "on",
                                                init_weights=True)
    mf = torch.channels_last if args.format == "nhwc" else torch.contiguous_format
    model = model.to(dev).to(memory_format=mf)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=dev).to(memory_format=mf)
    y = torch.randint(0, 1000, (args.batch_size,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ce = torch.nn.functional.cross_entropy

    def loss_of(out):
        if hasattr(out, "aux_logits") and out.aux_logits is not None:
            return ce(out.logits, y) + 0.4 * ce(out.aux_logits, y)
        return ce(out if torch.is_tensor(out) else out.logits, y)

    def forward():
        model.eval()
        with torch.no_grad():
            model(x)

    def forward_train():
        model.train()
        model(x)  # autograd records the graph, as a training forward does; backward is not run

    def forward_backward():
        model.train()
        opt.zero_grad(set_to_none=False)
        loss_of(model(x)).backward()

    def step():
        forward_backward()
        opt.step()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    out = {}
    for name, fn in [("forward", forward), ("forward_train", forward_train), ("forward_backward", forward_backward),
                     ("step", step)]:
        for _ in range(args.warmup):
            fn()
        sync()
        ms = []
        for _ in range(args.repetitions):
            t0 = time.perf_counter()
            fn()
            sync()
            ms.append((time.perf_counter() - t0) * 1e3)
        out[name] = statistics.median(ms)
    out["torch"] = torch.__version__
    out["threads"] = torch.get_num_threads()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
