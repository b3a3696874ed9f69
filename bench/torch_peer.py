#!/usr/bin/env python3
"""The peer: the same training-step phases in PyTorch (Debian's python3-torch on the CPU, or a CUDA
build on a GPU machine), timed the same way stepbench times them (warm-up, then the median of N timed
repetitions), so the two can be compared as a ratio in the same run. Prints one JSON object on its
last line: {"phase": median_ms, ..., "timing": "cuda events" | "host"}; on CUDA the medians are
device time between events (as stepbench's), and "host_ms" holds the host wall times. "memory" has
the process's resident memory before the model was built and its peak over the phases (and on CUDA
torch.cuda.max_memory_allocated), for stepbench's memory line.

  bench/torch_peer.py --model inception_v3 --batch-size 8 --image-size 299 --format nchw
  bench/torch_peer.py --model resnet50 --batch-size 32 --image-size 224 --format nhwc
  bench/torch_peer.py --device cuda --batch-size 128 --format nhwc --precision bf16 [--compile]

Precision as stepbench's: fp32 (TF32 off for convolutions and matmuls), tf32 (on for both), bf16 and
fp16 through autocast (fp16 with a GradScaler in the step). Each timed repetition makes as many calls
as fill --min-time seconds (Google Benchmark's rule for stepbench's repetitions; the warm-up's last
call sets the count), or exactly --calls; the median is per call.

--layer-times N: after the phases, N more steps under PyTorch's profiler (CPU activities), with each
of torchvision's layers (BasicConv2d = conv + BN + ReLU, the pooling, dropout and fc modules, and the
functional pools inside the Inception blocks; ResNet-50's conv1 + bn1 + relu, each bottleneck's
conv + BN (+ ReLU) units, downsample and its `out += identity; relu(out)`) as a record_function
range: per layer, the median forward time (its range) and backward time (the autograd functions
whose sequence numbers its forward ops recorded), named as stepbench names its layers; under
"layers" in the JSON.

Exit 77 when torch or torchvision is missing."""
import argparse, contextlib, json, math, os, statistics, sys, time

try:
    import torch
    import torchvision
except ImportError as e:
    print(f"SKIP: {e}; install python3-torch and python3-torchvision", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="inception_v3", choices=["inception_v3", "resnet50", "resnet101", "resnet152", "vgg16",
                                                                 "alexnet", "densenet121", "mobilenet_v2", "tiny"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=299)
    ap.add_argument("--format", default="nchw", choices=["nchw", "nhwc"])
    ap.add_argument("--aux-logits", default="on", choices=["on", "off"], help="inception_v3's auxiliary head")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads; 0: OMP_NUM_THREADS when set, else every core (as OpenMP's default)")
    ap.add_argument("--dropout", type=float, default=0.5,
                    help="in training, as stepbench's model: before inception_v3's final fc, in VGG's and AlexNet's "
                         "classifiers (the resnets and densenet121 have none)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
    ap.add_argument("--phases", default="forward,forward_train,forward_backward,step")
    ap.add_argument("--calls", type=int, default=0,
                    help="calls per timed repetition (the median is per call); 0: as many as fill --min-time")
    ap.add_argument("--layer-times", type=int, default=0, metavar="N",
                    help="after the phases, N profiled steps: per-layer forward and backward medians")
    ap.add_argument("--min-time", type=float, default=0.5,
                    help="seconds each repetition lasts at least (Google Benchmark's --benchmark_min_time)")
    args = ap.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - {"forward", "forward_train", "forward_backward", "step"}
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}")
    if args.calls < 0 or args.min_time < 0 or args.layer_times < 0 or not 0 <= args.dropout < 1:
        ap.error("--calls, --min-time and --layer-times are at least 0, --dropout in [0, 1)")
    # Debian's torch starts with one thread here; take stepbench's count (--threads), else OpenMP's
    # default: OMP_NUM_THREADS, or every core
    omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]
    torch.set_num_threads(args.threads or (int(omp) if omp.isdigit() and int(omp) > 0 else os.cpu_count() or 1))
    dev = torch.device(args.device)
    if dev.type == "cuda":
        tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
    elif args.precision not in ("fp32", "bf16"):
        print(f"the peer runs --precision {args.precision} on CUDA only (the CPU: fp32, or bf16 through autocast)",
              file=sys.stderr)
        sys.exit(2)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    baseline_rss = proc_status_bytes("VmRSS")  # before the model: torch imported, nothing built
    if args.model == "tiny":
        from torch_parity import Tiny  # the same network as src/models/tiny.cpp
        model = Tiny(dropout=args.dropout)
    elif args.model.startswith("resnet") or args.model == "densenet121":  # torchvision's initialisation; no dropout
        model = getattr(torchvision.models, args.model)(weights=None)  # the resnets v1.5 (as src/models/resnet.cpp)
        args.dropout = 0.0
    elif args.model in ("vgg16", "alexnet"):  # the classifier's two dropouts
        model = getattr(torchvision.models, args.model)(weights=None, dropout=args.dropout)
    elif args.model == "mobilenet_v2":  # torchvision's own 0.2 before the classifier, as stepbench's (0: none)
        args.dropout = 0.2 if args.dropout > 0 else 0.0
        model = torchvision.models.mobilenet_v2(weights=None, dropout=args.dropout)
    else:
        model = torchvision.models.inception_v3(weights=None, aux_logits=args.aux_logits == "on",
                                                init_weights=True, dropout=args.dropout)
    mf = torch.channels_last if args.format == "nhwc" else torch.contiguous_format
    model = model.to(dev).to(memory_format=mf)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=dev).to(memory_format=mf)
    y = torch.randint(0, 1000, (args.batch_size,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    ce = torch.nn.functional.cross_entropy
    scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
    net = torch.compile(model) if args.compile else model

    def autocast():
        return torch.autocast(dev.type, dtype=amp) if amp is not None else contextlib.nullcontext()

    def loss_of(out):
        if hasattr(out, "aux_logits") and out.aux_logits is not None:
            return ce(out.logits, y) + 0.4 * ce(out.aux_logits, y)
        return ce(out if torch.is_tensor(out) else out.logits, y)

    def forward():
        model.eval()
        with torch.inference_mode(), autocast():
            net(x)

    def forward_train():
        model.train()
        with autocast():
            net(x)  # autograd records the graph, as a training forward does; backward is not run

    def forward_backward():
        model.train()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_of(net(x))
        (scaler.scale(loss) if scaler else loss).backward()

    def step():
        forward_backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    out, host, calls = {}, {}, {}
    fns = {"forward": forward, "forward_train": forward_train, "forward_backward": forward_backward, "step": step}
    for name in phases:
        fn = fns[name]
        t0 = time.perf_counter()
        for _ in range(max(args.warmup - 1, 0)):
            fn()
        sync()
        if args.compile:
            print(f"peer: {name}: warm-up (compilation included) {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        t1 = time.perf_counter()
        fn()  # the last warm-up call, timed: how many calls fill --min-time
        sync()
        last = time.perf_counter() - t1
        n = args.calls or max(1, min(100000, math.ceil(args.min_time / max(last, 1e-6))))
        calls[name] = n
        ms, hs = [], []
        for _ in range(args.repetitions):
            if dev.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            if dev.type == "cuda":
                b.record()
            sync()
            hs.append((time.perf_counter() - t0) * 1e3 / n)
            ms.append(a.elapsed_time(b) / n if dev.type == "cuda" else hs[-1])
        out[name] = statistics.median(ms)
        host[name] = statistics.median(hs)
    # the process's resident peak over the phases (before the profiled steps, whose records add to
    # it), and on CUDA the caching allocator's peak of allocated bytes
    out["memory"] = {"baseline_rss_bytes": baseline_rss, "peak_rss_bytes": proc_status_bytes("VmHWM")}
    if dev.type == "cuda":
        out["memory"]["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    if args.layer_times:
        out["layers"] = layer_times(model, step, sync, args.layer_times, args.model)
    out["timing"] = "cuda events" if dev.type == "cuda" else "host"
    out["host_ms"] = host
    out["calls"] = calls
    out["precision"] = args.precision
    out["compile"] = args.compile
    out["torch"] = torch.__version__
    if dev.type == "cuda":
        out["device"] = torch.cuda.get_device_name(dev)
        out["cudnn"] = torch.backends.cudnn.version()
    out["threads"] = torch.get_num_threads()
    # what decides the peer's numerics, to set beside stepbench's --precision
    if dev.type == "cuda":
        out["settings"] = (f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}, "
                           f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                           f"cudnn.benchmark={torch.backends.cudnn.benchmark}, "
                           f"autocast={str(amp).replace('torch.', '') if amp is not None else 'off'}"
                           f"{', GradScaler' if args.precision == 'fp16' else ''}, {out['threads']} threads")
    else:
        out["settings"] = (f"autocast(cpu, bfloat16) on the CPU, {out['threads']} threads" if amp is not None
                           else f"fp32 on the CPU, autocast=off, {out['threads']} threads")
    dropout = f"none ({args.model} has none)" if args.model.startswith(("resnet", "densenet")) else f"{args.dropout:g}"
    out["settings"] += (f", dropout {dropout}, {'torch.compile' if args.compile else 'eager'}, "
                        f"calls per repetition {'/'.join(str(calls[p]) for p in phases)} ({','.join(phases)})")
    print(json.dumps(out))


def proc_status_bytes(field):
    """VmRSS (resident now) or VmHWM (its high-water mark) of this process in bytes; 0 without /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# the aten ops of the functional pools inside torchvision's Inception blocks, and stepbench's names
POOL_OPS = {"aten::avg_pool2d": "avg_pool", "aten::max_pool2d": "max_pool", "aten::adaptive_avg_pool2d": "adaptive_avg_pool"}


def resnet_block_forward(self, x):
    """torchvision's Bottleneck.forward, the same ops, with each of stepbench's units a range."""
    rf, name = torch.autograd.profiler.record_function, self.stepbench_name
    identity = x
    with rf(f"layer:{name}.conv1"):
        out = self.relu(self.bn1(self.conv1(x)))
    with rf(f"layer:{name}.conv2"):
        out = self.relu(self.bn2(self.conv2(out)))
    with rf(f"layer:{name}.conv3"):
        out = self.bn3(self.conv3(out))
    if self.downsample is not None:
        with rf(f"layer:{name}.downsample"):
            identity = self.downsample(x)
    with rf(f"layer:{name}.add_relu"):
        out += identity
        out = self.relu(out)
    return out


def layer_times(model, step, sync, steps, model_name):
    """Per layer, {"forward_ms", "backward_ms"}: medians over `steps` profiled steps (host time of the
    CPU ops; on CUDA the launches, not the kernels)."""
    leaves = ("BasicConv2d", "MaxPool2d", "AdaptiveAvgPool2d", "Dropout", "Linear")
    if model_name in ("vgg16", "alexnet", "densenet121", "mobilenet_v2"):  # their layers are plain modules
        leaves += ("Conv2d", "BatchNorm2d", "ReLU", "ReLU6", "AvgPool2d")
    stack = []

    def enter(name):
        def hook(mod, inp):
            r = torch.autograd.profiler.record_function("layer:" + name)
            r.__enter__()
            stack.append(r)
        return hook

    def leave(mod, inp, out):
        stack.pop().__exit__(None, None, None)

    # the layers, and the blocks and AuxLogits: containers (modules with a BasicConv2d child, not the
    # model), whose functional pools are layers
    containers = {name for name, mod in model.named_modules()
                  if name and type(mod).__name__ not in leaves
                  and any(type(ch).__name__ == "BasicConv2d" for ch in mod.children())}
    handles, blocks = [], []
    if model_name.startswith("resnet"):
        # the stem's conv1 + bn1 + relu is one unit; each bottleneck runs its units as ranges
        handles += [model.conv1.register_forward_pre_hook(enter("conv1")), model.relu.register_forward_hook(leave)]
        for name in ("maxpool", "avgpool", "fc"):
            mod = getattr(model, name)
            handles += [mod.register_forward_pre_hook(enter(name)), mod.register_forward_hook(leave)]
        for name, mod in model.named_modules():
            if type(mod).__name__ == "Bottleneck":
                mod.stepbench_name = name
                mod.forward = resnet_block_forward.__get__(mod)
                blocks.append(mod)
    else:
        for name, mod in model.named_modules():
            if type(mod).__name__ in leaves or name in containers:
                handles += [mod.register_forward_pre_hook(enter(name)), mod.register_forward_hook(leave)]
    per_step = []
    try:
        for _ in range(steps):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                step()
                sync()
            per_step.append(attribute(prof.events(), containers))
    finally:
        for h in handles:
            h.remove()
        for mod in blocks:
            del mod.forward  # torchvision's own again
    names = sorted({n for d in per_step for n in d})
    return {n: {k: statistics.median(d.get(n, {}).get(k, 0.0) for d in per_step) for k in ("forward_ms", "backward_ms")}
            for n in names}


def attribute(events, containers):
    """One profiled step's events -> {layer: {"forward_ms", "backward_ms"}}."""
    def is_container(range_name):  # "layer:Mixed_5b": a block, not a layer
        return range_name.startswith("layer:") and range_name[len("layer:"):] in containers

    def layer_of(e):  # the innermost layer range around an op; in a block, its functional pool
        p, top = e.cpu_parent, e
        while p is not None and not p.name.startswith("layer:"):
            p, top = p.cpu_parent, p
        if p is None:
            return None
        if is_container(p.name):
            return f"{p.name[len('layer:'):]}.{POOL_OPS[top.name]}" if top.name in POOL_OPS else None
        return p.name[len("layer:"):]

    out, seq_layer = {}, {}

    def add(name, key, us):
        out.setdefault(name, {"forward_ms": 0.0, "backward_ms": 0.0})[key] += us / 1e3

    for e in events:
        if e.name.startswith("layer:") and not is_container(e.name):
            add(e.name[len("layer:"):], "forward_ms", e.cpu_time_total)
        elif e.name in POOL_OPS and e.cpu_parent is not None and is_container(e.cpu_parent.name):
            add(layer_of(e), "forward_ms", e.cpu_time_total)
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::"):
            name = layer_of(e)
            if name:
                seq_layer.setdefault(e.sequence_nr, name)
    for e in events:
        if e.name.startswith("autograd::engine::evaluate_function:") and e.sequence_nr in seq_layer:
            add(seq_layer[e.sequence_nr], "backward_ms", e.cpu_time_total)
    return out


if __name__ == "__main__":
    main()
