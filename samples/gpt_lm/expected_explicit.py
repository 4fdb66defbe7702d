"""
Train a small GPT language model on one GPU or with DDP over several.

Single GPU:
    python train_gpu.py batch_size=32 compile=False
DDP on one node with 4 GPUs:
    torchrun --standalone --nproc_per_node=4 train_gpu.py

Every module-level setting below can be overridden on the command line as key=value (the value is parsed as a
Python literal when it is one, e.g. max_iters=100 learning_rate=3e-4 compile=False).
"""
import ast
import inspect
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch_npu
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
import random

# -----------------------------------------------------------------------------
# I/O
out_dir = "out"
eval_interval = 250
log_interval = 10
eval_iters = 20
eval_only = False  # evaluate once at iteration 0 and exit
always_save_checkpoint = False  # save a checkpoint at every evaluation, not only on a new best val loss
# data: a synthetic corpus of random tokens with planted structure (see make_corpus)
corpus_tokens = 200_000
gradient_accumulation_steps = 8  # micro-batches per optimizer step (per process: divided by the DDP world size)
batch_size = 16  # micro-batch size
block_size = 128
# model
n_layer = 4
n_head = 4
n_embd = 256
vocab_size = 512
dropout = 0.0  # no dropout for pretraining; 0.1 and up for finetuning
bias = False  # biases in the linear and LayerNorm layers
# AdamW
learning_rate = 6e-4
max_iters = 5000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # clip the global gradient norm at this value; 0.0 disables clipping
# learning rate schedule: linear warmup then cosine decay down to min_lr
decay_lr = True
warmup_iters = 200
lr_decay_iters = 5000  # about max_iters
min_lr = 6e-5  # about learning_rate / 10
# DDP
backend = "hccl"
# system
device = "npu" if torch.npu.is_available() else "cpu"  # or cuda:1, cpu, mps
dtype = "bfloat16" if torch.npu.is_available() and torch.npu.is_bf16_supported() else "float16"
compile = True  # torch.compile the model (PyTorch 2)
seed = 1337
# -----------------------------------------------------------------------------


def apply_overrides(argv, settings):
    """Set `key=value` pairs from the command line on the module-level settings, keeping each setting's type."""
    for arg in argv:
        key, sep, text = arg.lstrip("-").partition("=")
        if not sep or key not in settings:
            raise SystemExit(f"unknown setting {arg!r}; use key=value with one of: {', '.join(sorted(settings))}")
        try:
            value = ast.literal_eval(text)
        except (SyntaxError, ValueError):
            value = text  # a bare string such as device=cpu
        if type(value) is not type(settings[key]) and not (isinstance(settings[key], float) and isinstance(value, int)):
            raise SystemExit(f"{key} must be a {type(settings[key]).__name__}, got {text!r}")
        print(f"Overriding: {key} = {value!r}")
        settings[key] = type(settings[key])(value)


config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
apply_overrides(sys.argv[1:], globals())
config = {k: globals()[k] for k in config_keys}  # saved in checkpoints and logs

# -----------------------------------------------------------------------------
# Model


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout

    def forward(self, x):
        batch, time_steps, channels = x.size()
        # (B, T, 3C) -> three (B, nh, T, hs) tensors
        q, k, v = (
            part.view(batch, time_steps, self.n_head, channels // self.n_head).transpose(1, 2)
            for part in self.qkv(x).split(channels, dim=2)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(batch, time_steps, channels)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.down = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying

        self.apply(self._init_weights)
        # GPT-2 scales the init of the residual projections by 1/sqrt(2 * n_layer).
        for name, param in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        print(f"number of parameters: {self.num_params() / 1e6:.2f}M")

    def num_params(self):
        """Parameters without the position embedding (the token embedding is shared with lm_head, so it counts)."""
        return sum(p.numel() for p in self.parameters()) - self.pos_emb.weight.numel()

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        _, time_steps = idx.size()
        assert time_steps <= self.config.block_size, f"sequence of {time_steps} > block size {self.config.block_size}"
        pos = torch.arange(time_steps, dtype=torch.long, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # Matrices (weights of Linear and Embedding) decay; biases and LayerNorm gains do not.
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        # The fused AdamW kernel is much faster, where this torch has it and the parameters are on a GPU.
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == "npu"
        print(f"using fused AdamW: {use_fused}")
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=use_fused)


# -----------------------------------------------------------------------------
# Distributed setup: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"npu:{ddp_local_rank}"
    torch.npu.set_device(device)
    master_process = ddp_rank == 0  # logs and checkpoints
    seed_offset = ddp_rank  # a different seed on each rank
    # The global batch stays the same: each rank runs its share of the micro-batches.
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
print(f"tokens per iteration will be: {tokens_per_iter:,}")

if master_process:
    os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(seed + seed_offset)
random.seed(seed + seed_offset)
np.random.seed(seed + seed_offset)
torch.npu.matmul.allow_hf32 = True  # TF32 matmuls on Ampere and newer
torch.npu.conv.allow_hf32 = True  # TF32 convolutions
device_type = "npu" if "npu" in device else "cpu"  # for torch.autocast
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# -----------------------------------------------------------------------------
# Data


def make_corpus(num_tokens, vocab, seed):
    """A token stream where each token is, most of the time, a fixed function of the previous one: learnable."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab)
    tokens = np.empty(num_tokens, dtype=np.uint16)
    tokens[0] = rng.integers(vocab)
    noise = rng.integers(vocab, size=num_tokens)
    keep = rng.random(num_tokens) < 0.8
    for i in range(1, num_tokens):
        tokens[i] = successor[tokens[i - 1]] if keep[i] else noise[i]
    return tokens


corpus = make_corpus(corpus_tokens, vocab_size, seed=seed)  # the same corpus on every rank
split = int(0.9 * len(corpus))
data = {"train": corpus[:split], "val": corpus[split:]}


def get_batch(split):
    tokens = data[split]
    ix = torch.randint(len(tokens) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(tokens[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(tokens[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    if device_type == "npu":
        # pinned memory lets the host-to-device copies run asynchronously
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


# -----------------------------------------------------------------------------
# Model, optimizer, loss scaling

iter_num = 0
best_val_loss = 1e9

model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                  vocab_size=vocab_size, dropout=dropout)
model = GPT(GPTConfig(**model_args))
model.to(device)

# A GradScaler only does something for float16; with bfloat16 or float32 it is a no-op.
scaler = torch.amp.GradScaler("npu", enabled=(dtype == "float16"))

optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)

if compile:
    print("compiling the model... (takes a ~minute)")
    unoptimized_model = model
    model = torch.compile(model)

if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])


@torch.no_grad()
def estimate_loss():
    """Mean loss over eval_iters batches of each split."""
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    """Linear warmup for warmup_iters, cosine decay to min_lr until lr_decay_iters, min_lr after that."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # goes from 1 to 0
    return min_lr + coeff * (learning_rate - min_lr)


# -----------------------------------------------------------------------------
# Training loop

X, Y = get_batch("train")  # the first batch
t0 = time.time()
raw_model = model.module if ddp else model
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": config,
                }
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
    if iter_num == 0 and eval_only:
        break

    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            # Synchronise gradients on the last micro-step only; the others just accumulate locally.
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # the mean over the micro-batches
        # fetch the next batch while the GPU is busy with the forward pass
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        # loss.item() waits for the GPU; scale back up to the loss of the whole accumulated batch
        lossf = loss.item() * gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, lr {lr:.2e}")
    iter_num += 1

    if iter_num > max_iters:
        break

if ddp:
    destroy_process_group()
