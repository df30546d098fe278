#!/usr/bin/env python3
# gguf_py_twin.py: the GGUF that spec/support/to_gguf.lua wrote for a loip synth model, written
# again by llama.cpp's own gguf-py, with every tensor named by gguf-py's TensorNameMap for the
# file's architecture (the map convert_hf_to_gguf.py names Hugging Face tensors with), so that
# the names llama.cpp reads are its own, not loip's. The tensor bytes and the metadata are
# loip's file's; the script fails when a Hugging Face tensor's name, as gguf-py maps it, is not
# in loip's file with the same shape, or when either file has a tensor the other has not.
#
#   PYTHONPATH=llama.cpp/gguf-py python3 gguf_py_twin.py SYNTH_DIR LOIP.gguf OUT.gguf
import json, struct, sys
import gguf

src, theirs, out = sys.argv[1], sys.argv[2], sys.argv[3]
r = gguf.GGUFReader(theirs)

def value(field):
    t = field.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        if field.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]) for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]

arch = value(r.fields["general.architecture"])
n_layers = value(r.fields[arch + ".block_count"])
names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_layers)

# the Hugging Face tensor names and shapes (model.safetensors: a header length, a JSON header)
with open(src + "/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
loip_tensors = {t.name: t for t in r.tensors}
mapped = set()
for name, info in sorted(header.items()):
    if name == "__metadata__":
        continue
    new = names.get_name(name, try_suffixes=(".weight", ".bias"))
    assert new is not None, "gguf-py has no name for " + name
    t = loip_tensors.get(new)
    assert t is not None, "%s -> %s: not in %s" % (name, new, theirs)
    assert list(reversed(t.shape.tolist())) == info["shape"], (name, new, t.shape.tolist(), info["shape"])
    mapped.add(new)
    print(name, "->", new)
extra = set(loip_tensors) - mapped - {"rope_freqs.weight"}
assert not extra, "in loip's file only: %s" % sorted(extra)

w = gguf.GGUFWriter(out, arch)
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    w.add_key_value(key, value(field), field.types[0])
for t in r.tensors:
    w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
