"""The Qwen3-14B decode scene's reference decode in PyTorch, written from the scene
contract (docs/scene-qwen3-decode.md, "Golden") independently of the C++ golden.

It is the correctness anchor of the C++ golden (tests/python/test_golden_vs_torch.py) and
the speed baseline it is measured against (bench/golden_vs_torch.py). All arithmetic is
float32; bf16 rounding happens exactly where the contract says bf16r.
"""
import json
import math
import mmap
import struct

import torch

NUM_HEADS = 40
NUM_KV_HEADS = 8
HEAD_DIM = 128
HIDDEN = NUM_HEADS * HEAD_DIM
KV_HIDDEN = NUM_KV_HEADS * HEAD_DIM
Q_PER_KV = NUM_HEADS // NUM_KV_HEADS
HALF_DIM = HEAD_DIM // 2
INTERMEDIATE = 17408
BATCH = 16
EPS = 1e-6
ATTN_SCALE = 1.0 / math.sqrt(HEAD_DIM)
MAX_SEQ = 5500
BLOCK_SIZE = 128
MAX_BLOCKS_PER_SEQ = (MAX_SEQ + BLOCK_SIZE - 1) // BLOCK_SIZE
NUM_PAGES = BATCH * MAX_BLOCKS_PER_SEQ
CACHE_ROWS = NUM_PAGES * NUM_KV_HEADS * BLOCK_SIZE
RTOL = 5e-2
ATOL = 1e-1


def bf16r(x):
    """Round float32 to bf16 (nearest even) and back."""
    return x.to(torch.bfloat16).to(torch.float32)


def inv_rms(x):
    """1 / sqrt(mean(x^2) + EPS) over the last dim, kept for broadcasting."""
    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)


def rope_half(v, cos, sin):
    lo, hi = v[..., :HALF_DIM], v[..., HALF_DIM:]
    return torch.cat(
        [lo * cos[..., :HALF_DIM] - hi * sin[..., :HALF_DIM],
         hi * cos[..., HALF_DIM:] + lo * sin[..., HALF_DIM:]],
        dim=-1,
    )


def layer_slice(t, layer, rows):
    """Layer `layer`'s slice of a matrix stacked as [L*rows, cols]."""
    return t[layer * rows:(layer + 1) * rows]


def decode(t, n_layers):
    """Runs the reference decode.

    t maps the twenty argument names to tensors (dtypes as in the contract; only read).
    Returns (out bf16 [16, 5120], rows int64 [n_layers*16*8], k_rows bf16 [n, 128],
    v_rows bf16 [n, 128]) with rows ordered by layer, then lane, then kv head.
    """
    x = t["hidden_states"].to(torch.float32)
    seq_lens = t["seq_lens"].to(torch.int64)
    block_table = t["block_table"].to(torch.int64)
    slot_mapping = t["slot_mapping"].to(torch.int64)
    pos = seq_lens - 1
    cos = t["rope_cos"][pos].unsqueeze(1)  # [16, 1, 128]: broadcast over heads
    sin = t["rope_sin"][pos].unsqueeze(1)
    rows, k_rows, v_rows = [], [], []
    for layer in range(n_layers):
        # 1-3: projections of the bf16 input, scaled by the input RMS afterwards.
        inv = inv_rms(x)
        normed = bf16r(x * t["input_rms_weight"][layer])
        q = (normed @ layer_slice(t["wq"], layer, HIDDEN).float()) * inv
        k = (normed @ layer_slice(t["wk"], layer, HIDDEN).float()) * inv
        v = (normed @ layer_slice(t["wv"], layer, HIDDEN).float()) * inv
        # 4: per-head RMS norm with its weight.
        q = q.view(BATCH, NUM_HEADS, HEAD_DIM)
        k = k.view(BATCH, NUM_KV_HEADS, HEAD_DIM)
        v = v.view(BATCH, NUM_KV_HEADS, HEAD_DIM)
        q = q * inv_rms(q) * t["q_norm_weight"][layer]
        k = k * inv_rms(k) * t["k_norm_weight"][layer]
        # 5: RoPE at each lane's current position.
        q_rot = bf16r(rope_half(q, cos, sin))
        k_cur = bf16r(rope_half(k, cos, sin))
        v_cur = bf16r(v)
        # 6: paged attention; the pool reads as [NUM_PAGES*128 token rows, 8 heads, 128].
        k_pool = layer_slice(t["k_cache"], layer, CACHE_ROWS).view(
            NUM_PAGES * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        v_pool = layer_slice(t["v_cache"], layer, CACHE_ROWS).view(
            NUM_PAGES * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        attn = torch.empty(BATCH, NUM_HEADS, HEAD_DIM)
        for b in range(BATCH):
            s = int(seq_lens[b])
            blocks = (s + BLOCK_SIZE - 1) // BLOCK_SIZE
            pages = block_table[b * MAX_BLOCKS_PER_SEQ:b * MAX_BLOCKS_PER_SEQ + blocks]
            token_rows = (pages.unsqueeze(1) * BLOCK_SIZE + torch.arange(BLOCK_SIZE)).reshape(-1)[:s]
            keys = k_pool[token_rows].float()  # [s, 8, 128]
            values = v_pool[token_rows].float()
            keys[s - 1] = k_cur[b]
            values[s - 1] = v_cur[b]
            qg = q_rot[b].view(NUM_KV_HEADS, Q_PER_KV, HEAD_DIM)  # query head h*5+j
            scores = torch.einsum("hjd,shd->hjs", qg, keys) * ATTN_SCALE
            weights = torch.softmax(scores, dim=-1)
            attn[b] = torch.einsum("hjs,shd->hjd", weights, values).reshape(NUM_HEADS, HEAD_DIM)
        # 7: output projection, f32 residual.
        attn = bf16r(attn.reshape(BATCH, HIDDEN))
        h1 = x + attn @ layer_slice(t["wo"], layer, HIDDEN).float()
        # 8-9: post-attention RMS and the gated MLP.
        post = inv_rms(h1)
        mlp_in = bf16r(h1 * t["post_rms_weight"][layer])
        sg = (mlp_in @ layer_slice(t["w_gate"], layer, HIDDEN).float()) * post
        su = (mlp_in @ layer_slice(t["w_up"], layer, HIDDEN).float()) * post
        mlp = bf16r(sg * torch.sigmoid(sg) * su)
        # 10: down projection, f32 carry.
        x = mlp @ layer_slice(t["w_down"], layer, INTERMEDIATE).float() + h1
        # 11: the rows this layer writes.
        for b in range(BATCH):
            for h in range(NUM_KV_HEADS):
                rows.append(layer * CACHE_ROWS + int(slot_mapping[b]) * NUM_KV_HEADS + h)
        k_rows.append(k_cur.reshape(BATCH * NUM_KV_HEADS, HEAD_DIM))
        v_rows.append(v_cur.reshape(BATCH * NUM_KV_HEADS, HEAD_DIM))
    return (x.to(torch.bfloat16), torch.tensor(rows, dtype=torch.int64),
            torch.cat(k_rows).to(torch.bfloat16), torch.cat(v_rows).to(torch.bfloat16))


def mismatches(actual, expected):
    """Elements outside |a - b| <= ATOL + RTOL * |b| (NaN counts), as a bool tensor."""
    a = actual.float()
    b = expected.float()
    ok = (a - b).abs() <= ATOL + RTOL * b.abs()
    return ~ok


_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "I32": torch.int32,
    "I64": torch.int64,
}


def read_safetensors(path):
    """name -> tensor, viewing a private (copy-on-write) map of the file: nothing is copied."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = (end - begin) // torch.tensor([], dtype=dtype).element_size()
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=base + begin)
        tensors[name] = flat.view(info["shape"])
    return tensors
