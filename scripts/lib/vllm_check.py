"""What scripts/gpu-check-vllm.sh needs beside vllm itself (plain Python 3, no packages):

    vllm_check.py model DIR [--hidden 2048] [--layers 8]   a random Llama checkpoint
    vllm_check.py plugin DIR     a dist-info declaring pyproject.toml's vLLM entry point
    vllm_check.py summary OUT    vllm-<format>.log -> vllm.txt and vllm.json

`model` writes config.json, two bf16 safetensors shards and their index for
LlamaForCausalLM (no tokenizer: vllm serve runs with --skip-tokenizer-init). `plugin` is
for a pinstage that is importable but not pip-installed (a build's python/ folder): vLLM
finds its `vllm.general_plugins` entry point through the dist-info on PYTHONPATH, as
tests/python/test_engines_vllm.py does. `summary` reads vLLM's "Loading weights took" and
"Model loading took ... GiB memory and ... seconds" lines of each log.
"""
import argparse
import json
import os
import pathlib
import re
import struct
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
FORMATS = ("safetensors", "fastsafetensors", "pinstage")


def _shapes(hidden, layers, vocab=32000, heads=16, kv_heads=8):
    inter = hidden * 11 // 4 // 256 * 256
    kv = hidden // heads * kv_heads
    out = {"model.embed_tokens.weight": [vocab, hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": [hidden, hidden],
                    p + "self_attn.k_proj.weight": [kv, hidden],
                    p + "self_attn.v_proj.weight": [kv, hidden],
                    p + "self_attn.o_proj.weight": [hidden, hidden],
                    p + "mlp.gate_proj.weight": [inter, hidden],
                    p + "mlp.up_proj.weight": [inter, hidden],
                    p + "mlp.down_proj.weight": [hidden, inter],
                    p + "input_layernorm.weight": [hidden],
                    p + "post_attention_layernorm.weight": [hidden]})
    out["model.norm.weight"] = [hidden]
    out["lm_head.weight"] = [vocab, hidden]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    return out, config


def _write_shard(path, shapes):
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    # Small finite bf16 values (0x3c00-0x3cff: 0.008-0.03), so a forward pass stays finite.
    block = bytes(b for i in range(1 << 16) for b in (i & 0xFF, 0x3C))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        while offset > 0:
            f.write(block[:offset])
            offset -= min(offset, len(block))


def model(directory, hidden, layers):
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    shapes, config = _shapes(hidden, layers)
    names = list(shapes)
    half = len(names) // 2
    weight_map = {}
    for k, part in enumerate((names[:half], names[half:])):
        shard = f"model-{k + 1:05d}-of-00002.safetensors"
        _write_shard(d / shard, {n: shapes[n] for n in part})
        weight_map.update({n: shard for n in part})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    (d / "config.json").write_text(json.dumps(config, indent=1))
    size = sum(f.stat().st_size for f in d.glob("*.safetensors"))
    print(f"model: LlamaForCausalLM hidden {hidden}, {layers} layers, {size / 1e9:.2f} GB")


def plugin(directory):
    """The dist-info of pyproject.toml's [project.entry-points."vllm.general_plugins"]."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    group = project["entry-points"]["vllm.general_plugins"]
    info = pathlib.Path(directory) / "pinstage_entry_points-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pinstage-entry-points\n"
                                   "Version: 0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in group.items())
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{lines}")
    return group


WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")
MODEL = re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds")


def summary(out):
    """One line per format that ran: weights and whole-model load times."""
    out = pathlib.Path(out)
    rows = {}
    for fmt in FORMATS:
        log = out / f"vllm-{fmt}.log"
        if not log.exists():
            continue
        text = log.read_text(errors="replace")
        w, m = WEIGHTS.findall(text), MODEL.findall(text)
        rows[fmt] = {"weights_s": float(w[-1]) if w else None,
                     "model_gib": float(m[-1][0]) if m else None,
                     "model_s": float(m[-1][1]) if m else None}
    lines = [f"{'load format':16} {'weights s':>9} {'model load s':>12} {'GiB':>6}"]
    for fmt, r in rows.items():
        cells = [f"{r[k]:.2f}" if r[k] is not None else "-"
                 for k in ("weights_s", "model_s", "model_gib")]
        lines.append(f"{fmt:16} {cells[0]:>9} {cells[1]:>12} {cells[2]:>6}")
    (out / "vllm.txt").write_text("\n".join(lines) + "\n")
    tmp = out / "vllm.json.tmp"
    tmp.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp, out / "vllm.json")
    print("\n".join(lines))
    return 0 if rows and all(r["model_s"] is not None for r in rows.values()) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("model")
    m.add_argument("dir")
    m.add_argument("--hidden", type=int, default=2048)
    m.add_argument("--layers", type=int, default=8)
    sub.add_parser("plugin").add_argument("dir")
    sub.add_parser("summary").add_argument("out")
    a = ap.parse_args()
    if a.what == "model":
        if a.hidden < 256 or a.hidden % 256 or a.layers < 1:
            ap.error("--hidden must be a multiple of 256 (>= 256), --layers >= 1")
        return model(a.dir, a.hidden, a.layers)
    if a.what == "plugin":
        plugin(a.dir)
        return 0
    return summary(a.out)


if __name__ == "__main__":
    sys.exit(main())
