"""A GPT-2-small-class decoder whose attention and LayerNorms can be kernellab ops, and a byte-level corpus made of
the Python standard library's sources: what benchmarks/train_gpt2.py trains, with PyTorch's ops and with ours.

The blocks are kernellab.teach.block.TransformerBlock (pre-LayerNorm, causal attention, a 4x GELU MLP, biases as
GPT-2 has them), so the pluggable ops keep that module's contract:
    attention_op(q, k, v, causal) on contiguous [batch, heads, tokens, head_dim];
    norm_op(x2d, weight, bias, eps) on [rows, d_model];
    add_norm_op(x2d, r2d, weight, bias, eps) -> (x2d + r2d, LayerNorm(x2d + r2d) in r2d's dtype) on [rows, d_model]:
    with it, each residual add that a LayerNorm follows (the attention's, before the block's second norm; the MLP's,
    before the next block's first norm or the final norm) goes through it, add and norm in one op
    (kernellab.teach.add_norm); the first block's first norm stays norm_op's.
Without them the model is plain PyTorch (F.scaled_dot_product_attention, F.layer_norm). There is no dropout, so a
run is fixed by its seed (initial weights and batches) up to the kernels' own rounding.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernellab.teach.block import TransformerBlock


def pad_vocab(n: int, multiple: int = 64) -> int:
    """n rounded up to a multiple of `multiple` (an embedding whose rows tile evenly)."""
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes; the defaults are GPT-2 small's (124M parameters with its 50257-token vocabulary, 86.0M
    with 256 bytes)."""
    n_layers: int = 12
    d_model: int = 768
    n_heads: int = 12
    context: int = 1024
    vocab_size: int = pad_vocab(256)          # bytes, padded to a multiple of 64 (256 already is)
    mlp_ratio: int = 4
    eps: float = 1e-5

    @classmethod
    def tiny(cls) -> "GPTConfig":
        """A model small enough for a CPU test or a smoke run: 2 layers of 128, 2 heads of 64 (the head size the
        attention kernels take), 128 tokens."""
        return cls(n_layers=2, d_model=128, n_heads=2, context=128)


class GPT(nn.Module):
    """Token and position embeddings, n_layers pre-norm blocks, a final LayerNorm, and the output layer tied to the
    token embedding. forward(idx [B, N] int64, targets [B, N] or None) -> (logits [B, N, vocab], loss or None)."""

    def __init__(self, config: GPTConfig = GPTConfig(), *, attention_op=None, norm_op=None, add_norm_op=None,
                 device=None):
        super().__init__()
        c = config
        self.config, self.norm_op, self.attention_op, self.add_norm_op = c, norm_op, attention_op, add_norm_op
        self.wte = nn.Embedding(c.vocab_size, c.d_model, device=device)
        self.wpe = nn.Embedding(c.context, c.d_model, device=device)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, norm="layernorm", causal=True, mlp_ratio=c.mlp_ratio,
                             norm_op=norm_op, attention_op=attention_op, add_norm_op=add_norm_op, eps=c.eps,
                             device=device)
            for _ in range(c.n_layers))
        self.norm_f_w = nn.Parameter(torch.ones(c.d_model, device=device))
        self.norm_f_b = nn.Parameter(torch.zeros(c.d_model, device=device))
        self.reset_parameters()

    def set_ops(self, *, attention_op=None, norm_op=None, add_norm_op=None) -> "GPT":
        """Swap the pluggable ops (None: PyTorch's) in every block, keeping the weights; returns the model."""
        self.norm_op, self.attention_op, self.add_norm_op = norm_op, attention_op, add_norm_op
        for block in self.blocks:
            block.norm_op, block.attention_op, block.add_norm_op = norm_op, attention_op, add_norm_op
        return self

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases, the residual projections' weights scaled by
        1/sqrt(2 n_layers), LayerNorms at 1 and 0. Draws from torch's global generator (seed it first)."""
        for name, p in self.named_parameters():
            if name.endswith("_w") and "norm" in name:
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2 * self.config.n_layers) if name.endswith(("proj.weight", "down.weight")) \
                    else 0.02
                p.normal_(0.0, std)

    def num_parameters(self) -> int:
        """Parameters, the tied output layer counted once (it is the token embedding)."""
        return sum(p.numel() for p in self.parameters())

    def _norm_f(self, x):
        if self.norm_op is not None:
            d = self.config.d_model
            return self.norm_op(x.reshape(-1, d), self.norm_f_w, self.norm_f_b, self.config.eps).view(x.shape)
        return F.layer_norm(x, (self.config.d_model,), self.norm_f_w, self.norm_f_b, self.config.eps)

    def forward(self, idx, targets=None):
        B, N = idx.shape
        if N > self.config.context:
            raise ValueError(f"{N} tokens is more than the model's context of {self.config.context}")
        pos = torch.arange(N, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)                                        # [B, N, D]
        if self.add_norm_op is not None and len(self.blocks):    # each block's last add with the next norm
            first = self.blocks[0]
            h = first._norm(x, first.norm1_w, first.norm1_b)
            for i, block in enumerate(self.blocks):
                x, m = block.residual_step(x, h)
                nxt = self.blocks[i + 1] if i + 1 < len(self.blocks) else None
                w, b = (nxt.norm1_w, nxt.norm1_b) if nxt is not None else (self.norm_f_w, self.norm_f_b)
                x, h = block.add_norm(x, m, w, b)
        else:
            for block in self.blocks:
                x = block(x)
            h = self._norm_f(x)
        logits = F.linear(h, self.wte.weight)                                    # [B, N, vocab], tied
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(B * N, -1), targets.reshape(B * N))
        return logits, loss


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's *.py files sorted as paths (its site-packages/dist-packages left out)."""
    root = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if p.is_file() and not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts))


class ByteCorpus:
    """Bytes as tokens (0..255): the concatenated files, a split for training and one held out, and batches drawn
    from a seed: batch(step) is the same tensor for the same (seed, step), whatever came before."""

    def __init__(self, data: bytes, *, val_fraction: float = 0.05, name: str = "bytes"):
        if len(data) < 4:
            raise ValueError(f"a corpus of {len(data)} bytes is too small to draw a batch from")
        self.name = name
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        n_val = int(len(data) * val_fraction)
        self.train, self.val = self.tokens[:len(data) - n_val], self.tokens[len(data) - n_val:]
        self.sha256 = hashlib.sha256(data).hexdigest()

    @classmethod
    def stdlib(cls, root: str | Path | None = None, **kw) -> "ByteCorpus":
        """The Python standard library's sources (stdlib_files), read as bytes and joined in sorted order."""
        files = stdlib_files(root)
        if not files:
            raise FileNotFoundError(f"no *.py files under {root or sysconfig.get_paths()['stdlib']}")
        return cls(b"".join(f.read_bytes() for f in files), name=f"stdlib sources ({len(files)} files)", **kw)

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, seed: int, step: int, batch: int, seq: int, *, split: str = "train", device=None):
        """(inputs, targets), each [batch, seq] int64: windows of the split at offsets drawn from (seed, step);
        targets are the inputs shifted by one byte."""
        data = self.train if split == "train" else self.val
        if len(data) <= seq + 1:
            raise ValueError(f"the {split} split holds {len(data)} bytes, too few for windows of {seq + 1}")
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        windows = torch.stack([data[s:s + seq + 1] for s in starts.tolist()]).long()    # [batch, seq + 1]
        x, y = windows[:, :-1], windows[:, 1:]
        if device is not None:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return x, y


def lr_at(step: int, steps: int, lr: float, warmup: int, min_ratio: float = 0.1) -> float:
    """The learning rate of `step` (0-based): a linear warm-up over `warmup` steps to `lr`, then a cosine decay to
    min_ratio * lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(steps - 1 - warmup, 1)
    t = min((step - warmup) / span, 1.0)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@dataclass(frozen=True)
class TrainRun:
    """One training run: the loss of every step, each step's time (CUDA events on a GPU, the host clock on the CPU),
    and the held-out loss after the last step."""
    name: str
    seed: int
    losses: tuple[float, ...]
    step_ms: tuple[float, ...]
    tokens_per_step: int
    timed_from: int                 # steps before this one are warm-up (compilation, allocator, autotuning)
    val_loss: float
    wall_s: float
    profile: str = ""               # torch.profiler's table of profile_steps more steps, if asked for
    diagnosis: str = ""             # what train(diagnose=) returned: where a step's host time goes
    captured_at: int = -1           # graphs: the step that captured the CUDA graph (its time: capture + replay)
    replays: int = 0                # graphs: the graph's replays (training steps from captured_at, and profiled)

    @property
    def capture_ms(self) -> float | None:
        """The capturing step's time (capture, then its first replay), or None without graphs."""
        return self.step_ms[self.captured_at] if 0 <= self.captured_at < len(self.step_ms) else None

    @property
    def final_loss(self) -> float:
        return self.losses[-1]

    def mean_loss(self, last: int = 20) -> float:
        """The mean loss of the last `last` steps."""
        tail = self.losses[-last:]
        return sum(tail) / len(tail)

    @property
    def median_step_ms(self) -> float:
        timed = sorted(self.step_ms[self.timed_from:] or self.step_ms)
        mid = len(timed) // 2
        return timed[mid] if len(timed) % 2 else 0.5 * (timed[mid - 1] + timed[mid])

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / (self.median_step_ms * 1e-3)

    def __str__(self) -> str:
        return (f"{self.name}: {len(self.losses)} steps, final loss {self.final_loss:.4f}, last-20 mean "
                f"{self.mean_loss():.4f}, held-out {self.val_loss:.4f}, {self.median_step_ms:.2f} ms a step "
                f"({self.tokens_per_s / 1e3:.1f}k tokens/s)")


@dataclass(frozen=True)
class StepParts:
    """A training step in its phases, for a diagnosis: forward(x, y) -> loss (under autocast), then loss.backward(),
    then update() (clipping, the optimiser, zeroing the gradients); one_step(x, y) -> loss does all three."""
    forward: Callable
    update: Callable
    one_step: Callable
    batches: tuple
    device: torch.device


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's groups: decay on the matrices and embeddings, none on biases and norm weights."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


GRAPH_WARMUP = 3       # eager steps before the capture, on a side stream (PyTorch's whole-network recipe: 3)


@dataclass(frozen=True)
class GraphPlan:
    """Which steps of a graphed run do what: steps [0, warmup) train eagerly on a side stream (compiling, loading
    modules, autotuning, AdamW's state), step `warmup` captures and replays, the rest replay; timed_from is past the
    capture."""
    warmup: int
    timed_from: int


def graph_plan(steps: int, timed_from: int, warmup: int = GRAPH_WARMUP) -> GraphPlan:
    """The GraphPlan of a `steps`-step run whose timing would start at `timed_from`: at least one replayed step is
    timed after the capturing one."""
    if steps < warmup + 2:
        raise ValueError(f"a graphed run needs at least {warmup + 2} steps ({warmup} eager warm-up steps, the "
                         f"capture, a timed replay); got {steps}")
    return GraphPlan(warmup=warmup, timed_from=min(max(timed_from, warmup + 1), steps - 1))


def optimizer_options(lr: float, device: torch.device, graphs: bool) -> dict:
    """AdamW's keyword arguments: fused on a GPU; for graphs also capturable, with the learning rate a 0-d device
    tensor (set_lr fills it, so that the captured update reads each step's rate)."""
    if device.type != "cuda":
        return {"lr": lr}
    if graphs:
        return {"lr": torch.tensor(lr, dtype=torch.float32, device=device), "fused": True, "capturable": True}
    return {"lr": lr, "fused": True}


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate: a float assigned, or a tensor (a capturable optimiser's) filled in place."""
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr


class GraphedStep:
    """A training step `one_step(x, y) -> loss` captured as one CUDA graph on its first call, replayed after:
    the batch is copied into static input buffers, the graph replays, and the loss is copied out (the graph's own
    loss tensor is overwritten by the next replay). Gradients are None at capture (one_step ends by zeroing them
    with set_to_none), so backward allocates them from the graph's pool and every replay writes, not accumulates."""

    def __init__(self, one_step: Callable):
        self.one_step = one_step
        self.graph = None
        self.static_x = self.static_y = self.static_loss = None
        self.replays = 0
        self._side = None

    def stream_for(self, step: int, plan: GraphPlan):
        """The stream context of `step`: the side stream for the eager warm-up steps (joined back to the current
        stream after the last), the current stream for the capture and the replays."""
        if step >= plan.warmup:
            return contextlib.nullcontext()
        if self._side is None:
            self._side = torch.cuda.Stream()
            self._side.wait_stream(torch.cuda.current_stream())
        return _side_stream(self._side, join=step == plan.warmup - 1)

    def capture(self, x, y) -> None:
        """Capture one_step on static copies of (x, y); nothing runs on the GPU until the replay."""
        self.static_x, self.static_y = x.clone(), y.clone()
        self.graph = torch.cuda.CUDAGraph()                        # torch.cuda.graph synchronises before capturing
        with torch.cuda.graph(self.graph):
            self.static_loss = self.one_step(self.static_x, self.static_y)

    def __call__(self, x, y):
        if self.graph is None:
            self.capture(x, y)
        else:
            self.static_x.copy_(x)
            self.static_y.copy_(y)
        self.graph.replay()
        self.replays += 1
        return self.static_loss.detach().clone()


@contextlib.contextmanager
def _side_stream(side, join: bool):
    with torch.cuda.stream(side):
        yield
    if join:
        torch.cuda.current_stream().wait_stream(side)


def train(corpus: ByteCorpus, *, name: str = "run", config: GPTConfig = GPTConfig(), steps: int = 200,
          batch: int = 16, seq: int = 1024, seed: int = 0, device="cuda", attention_op=None, norm_op=None,
          add_norm_op=None, compile: bool = False, lr: float = 6e-4, warmup: int | None = None,
          weight_decay: float = 0.1, clip: float = 1.0, timed_from: int | None = None, val_batches: int = 4,
          progress=None, profile_steps: int = 0, diagnose=None, graphs: bool = False) -> TrainRun:
    """Train a GPT from `seed` (its initial weights, drawn on the CPU, and its batches) for `steps` steps: bf16
    autocast, AdamW (fused on a GPU), lr_at's schedule, gradients clipped to norm `clip`. PyTorch's SDPA backend is
    whatever the caller's context selects (torch.nn.attention.sdpa_kernel). progress(step, loss_tensor) is called
    after each step (it should not read the loss every step: that waits for the GPU). With profile_steps, that many
    more steps run under torch.profiler after the held-out loss, and TrainRun.profile holds the kernels' table.
    diagnose(step) -> str, if given, is called last with the training step's phases (StepParts: forward, backward,
    update, the batches, the device) and its text kept as TrainRun.diagnosis (benchmarks/train_gpt2.py --diagnose).
    graphs: the whole step (forward, backward, clipping, optimiser) as one CUDA graph (GraphedStep): the first
    graph_plan(steps).warmup steps train eagerly on a side stream, the next one captures and replays, the rest replay;
    AdamW is capturable with its learning rate a device tensor set before each replay (needs a GPU)."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    warmup = max(1, steps // 10) if warmup is None else warmup
    timed_from = min(10, steps // 4) if timed_from is None else timed_from
    gplan = graph_plan(steps, timed_from) if graphs else None
    if graphs:
        if not on_gpu:
            raise ValueError(f"graphs=True captures the step as a CUDA graph: it needs a CUDA device, not {device}")
        timed_from = gplan.timed_from
    torch.manual_seed(seed)
    model = GPT(config, attention_op=attention_op, norm_op=norm_op, add_norm_op=add_norm_op).to(device)
    step_fn = torch.compile(model) if compile else model
    opt = torch.optim.AdamW(param_groups(model, weight_decay), betas=(0.9, 0.95), eps=1e-8,
                            **optimizer_options(lr, device, graphs))
    batches = [corpus.batch(seed, s, batch, seq, device=device) for s in range(steps)]   # drawn before the clock
    losses, times = [], []
    if on_gpu:
        torch.cuda.synchronize(device)

    def forward(x, y):
        # no autocast weight cache under capture: cached casts would outlive the capture that allocated them
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not graphs):
            return step_fn(x, y)[1]

    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def one_step(x, y):
        loss = forward(x, y)
        loss.backward()
        update()
        return loss

    graphed = GraphedStep(one_step) if graphs else None
    t_start = time.perf_counter()
    for step, (x, y) in enumerate(batches):
        stream = graphed.stream_for(step, gplan) if graphs else contextlib.nullcontext()
        with stream:                                     # warm-up steps: on the side stream, events included
            set_lr(opt, lr_at(step, steps, lr, warmup))  # graphs: a fill on the stream that reads it
            if on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t0 = time.perf_counter()
            if graphs and step >= gplan.warmup:
                loss = graphed(x, y)                     # captures on its first call, then replays
            else:
                loss = one_step(x, y)
            if on_gpu:
                end.record()
                times.append((start, end))
            else:
                times.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.detach())                 # a warm-up loss read on the stream that wrote it
            if progress is not None:
                progress(step, losses[-1])
    if on_gpu:
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in times]
    wall_s = time.perf_counter() - t_start
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):     # eager: a compiled model would
        val = [model(*corpus.batch(seed, s, batch, seq, split="val", device=device))[1].float()   # compile again
               for s in range(val_batches)]
        val_loss = float(torch.stack(val).mean())
    profile = ""
    if profile_steps:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler
        activities = [ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
        with profiler(activities=activities) as prof:
            for x, y in batches[:profile_steps]:
                (graphed if graphed is not None and graphed.graph is not None else one_step)(x, y)
            if on_gpu:
                torch.cuda.synchronize(device)
        profile = prof.key_averages().table(sort_by="self_cuda_time_total" if on_gpu else "self_cpu_time_total",
                                            row_limit=15, max_name_column_width=70)
    if graphs and diagnose:
        diagnosis = "not diagnosed: the step is one CUDA graph replay, with no host path to split into phases"
    else:
        diagnosis = diagnose(StepParts(forward, update, one_step, tuple(batches), device)) if diagnose else ""
    return TrainRun(name=name, seed=seed, losses=tuple(torch.stack(losses).float().tolist()),
                    step_ms=tuple(float(t) for t in times), tokens_per_step=batch * seq, timed_from=timed_from,
                    val_loss=val_loss, wall_s=wall_s, profile=profile, diagnosis=diagnosis,
                    captured_at=gplan.warmup if graphs else -1,
                    replays=graphed.replays if graphed is not None else 0)


def smooth(curve, window: int = 10) -> list[float]:
    """The trailing mean over `window` steps, for each step from the window-th on (len(curve) - window + 1 values)."""
    curve = [float(v) for v in curve]
    window = max(1, min(window, len(curve)))
    out, total = [], sum(curve[:window])
    out.append(total / window)
    for i in range(window, len(curve)):
        total += curve[i] - curve[i - window]
        out.append(total / window)
    return out


@dataclass(frozen=True)
class NoiseVerdict:
    """Whether a curve `c` stays as close to the reference `a` as a second reference run `b` does: the largest gap
    between the smoothed curves, |smooth(c) - smooth(a)| against |smooth(b) - smooth(a)| (the band)."""
    within: bool
    gap: float                 # max over steps of |smooth(c) - smooth(a)|
    band: float                # max over steps of |smooth(b) - smooth(a)|
    gap_step: int              # the step (of the raw curves) where the gap is largest
    window: int

    def __str__(self) -> str:
        verdict = "within" if self.within else "OUTSIDE"
        ratio = f"{self.gap / self.band:.2f}x the band" if self.band > 0 else "band 0"
        return (f"{verdict} the noise band: max |c - a| = {self.gap:.4f} (at step {self.gap_step}) against max "
                f"|b - a| = {self.band:.4f} ({ratio}; {self.window}-step means)")


def within_noise(a, b, c, *, window: int = 10) -> NoiseVerdict:
    """The noise-band test: smooth each loss curve over `window` steps (trailing mean), and call `c` within the noise
    when its largest distance from `a` is at most the largest distance between the two reference runs `a` and `b`.
    The curves must have the same length."""
    if not (len(a) == len(b) == len(c)) or not len(a):
        raise ValueError(f"the curves have {len(a)}, {len(b)} and {len(c)} points; they need the same, at least 1")
    if not all(math.isfinite(float(v)) for v in list(a) + list(b)):
        raise ValueError("a reference curve holds a loss that is not finite: no band to test against")
    sa, sb, sc = smooth(a, window), smooth(b, window), smooth(c, window)
    band = max(abs(y - x) for x, y in zip(sa, sb))
    gaps = [abs(y - x) if math.isfinite(y) else math.inf for x, y in zip(sa, sc)]
    gap = max(gaps)
    return NoiseVerdict(within=gap <= band, gap=gap, band=band, gap_step=gaps.index(gap) + len(a) - len(sa),
                        window=min(window, len(a)))
