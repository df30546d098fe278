# mxfp4_nibbles.py DIR: gpt-oss's MXFP4 experts of DIR/hf (OpenAI's layout, 4 layers) dequantized
# as transformers' convert_moe_packed_tensors does (the low nibble the even element, scale 2^(e-127))
# against gguf-py's dequantization of DIR/m.gguf, which spec/support/to_gguf.lua wrote (gate rows:
# the even Hugging Face rows, up: the odd); prints the largest difference (0: the same values).
import json, struct, sys, numpy as np
# (run with PYTHONPATH=llama.cpp/gguf-py and Debian's python3-numpy)
from gguf import GGUFReader
from gguf.quants import dequantize
d = sys.argv[1]
f = open(d + '/hf/model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
def t(name):
    e = h[name]; a, b = e['data_offsets']; f.seek(base + a); return np.frombuffer(f.read(b - a), dtype=np.uint8).reshape(e['shape'])
lut = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
def hf_deq(blocks, scales):
    lo, hi = lut[blocks & 15], lut[blocks >> 4]
    out = np.empty(blocks.shape[:-1] + (32,), np.float32); out[..., 0::2] = lo; out[..., 1::2] = hi
    out = out * np.exp2(scales.astype(np.float32) - 127)[..., None]
    return out.reshape(blocks.shape[0], blocks.shape[1], -1)
r = GGUFReader(d + '/m.gguf'); g = {x.name: x for x in r.tensors}
worst = 0
for l in range(4):
    p = 'model.layers.%d.mlp.experts.' % l
    gu = hf_deq(t(p + 'gate_up_proj_blocks'), t(p + 'gate_up_proj_scales'))
    dn = hf_deq(t(p + 'down_proj_blocks'), t(p + 'down_proj_scales'))
    for name, want in (('ffn_gate_exps', gu[:, 0::2]), ('ffn_up_exps', gu[:, 1::2]), ('ffn_down_exps', dn)):
        x = g['blk.%d.%s.weight' % (l, name)]
        got = dequantize(x.data, x.tensor_type).reshape(want.shape)
        worst = max(worst, float(np.abs(got - want).max()))
print('max |gguf-py - transformers| over all experts:', worst)
