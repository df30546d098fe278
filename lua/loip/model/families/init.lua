-- Model families: one file a family (llama.lua, qwen2.lua, ...) describes an architecture in
-- both formats, and this module is where the rest of loip asks about one. docs/adding-a-model.md
-- walks through adding a family.
--
-- A family file returns a plain table (no FFI of its own: weight kinds from loip.core's constants,
-- weights derived in memory by loip.model.derive):
--
--   name      the family's name
--   classes   Hugging Face class (config.json's architectures[1]) -> its switches:
--               qkv_bias   true: q/k/v have biases; a string: the config field that says so
--               qk_norm    true: per-head RMSNorm of q and k before RoPE (Qwen3)
--               experts    a mixture of experts: { router, expert (a format of the expert's index
--                          and part), parts (gate, up, down), count, size (config fields of the
--                          expert count and an expert's size), renormalise (the top-k always
--                          renormalised: no norm_topk_prob), shared, shared_gate }
--                          router_bias (the router's bias tensor), list (function(c, l, prefix, W_EXPERT):
--                          a layer's expert weights when the files hold them otherwise than one
--                          tensor per expert and part; an entry may be derived from others:
--                          hf.weight_view)
--               shared     a shared expert beside the routed ones (Qwen2-MoE)
--               dense      (a mixture of experts) the dense class a token's work is priced as
--               layer      tensor name -> weight kind, or a list of kinds for a tensor fused by
--                          rows (Phi-3's qkv_proj: q, k, v), each part's rows as hf.shape_of
--                          gives them; replaces the common name of those kinds (hf.layer_names)
--               prefix     prepended to every tensor name (a language model inside another:
--                          Gemma3ForConditionalGeneration's language_model.)
--               alias      function(name): the tensor's name in another layout of the class's
--                          files, tried when name is not there (hf.find)
--               prepare    function(cfg, path): the config table the class reads, made from
--                          config.json's before any field is read (a nested text_config, the
--                          class's defaults for fields left out)
--               norms_zero_centred   its norms scale by 1 + w (loip synth draws w around 0)
--               config     function(cfg, path, field, c): after the common fields, refuses
--                          what the family's forward does not run (raises "path: field ...";
--                          field(cfg, path, name, kind, default) reads one) and sets the family's
--                          own switches in c (the loip_model_config)
--   gguf      GGUF architecture (general.architecture) -> what the file holds:
--               class, model_type   the Hugging Face class and model_type it reads as
--               interleaved         q/k rows in Meta's pairs (llama.cpp's `llama`)
--               experts, moe        a mixture of experts (moe: the class when the file has experts)
--               norm_topk_prob, shared   as llama.cpp runs it
--               attention_bias      false: the class always has q/k/v biases (no key written)
--               keys                metadata keys (without A.) llama.cpp's converter writes -> the
--                                   config field it takes (0 when the config has none), UINT32;
--                                   or { field, GGUF type }
--               layer               GGUF name (without blk.N.) -> kind or list of kinds (fused),
--                                   over llama.cpp's common names (gguf_model.layer_names)
--               config              function(md, cfg, get, path): more metadata into the config table
--                                   (as Hugging Face names it: the class's config then reads it)
--   shapes    name -> a real model's config.json fields (`loip synth --like NAME`)
--
-- What the forward runs is switched by loip_model_config's fields (qkv_bias, qk_norm,
-- rope_layout, n_experts, shared_expert, ...): C knows no family by name.
local M = {}

-- In the order `loip synth --like` and error messages list them.
M.list = {
  require "loip.model.families.gemma3",
  require "loip.model.families.llama",
  require "loip.model.families.gpt_oss",
  require "loip.model.families.mixtral",
  require "loip.model.families.phi3",
  require "loip.model.families.qwen2",
  require "loip.model.families.qwen2moe",
  require "loip.model.families.qwen3",
  require "loip.model.families.qwen3moe",
}

M.classes, M.gguf, M.shapes, M.family_of_class, M.family_of_gguf = {}, {}, {}, {}, {}
for _, f in ipairs(M.list) do
  for class, spec in pairs(f.classes or {}) do
    assert(not M.classes[class], class)
    M.classes[class], M.family_of_class[class] = spec, f
  end
  for arch, spec in pairs(f.gguf or {}) do
    assert(not M.gguf[arch], arch)
    M.gguf[arch], M.family_of_gguf[arch] = spec, f
  end
  for name, shape in pairs(f.shapes or {}) do
    assert(not M.shapes[name], name)
    M.shapes[name] = shape
  end
end

-- A routed expert's tensor names where no class is given (a weight list for sizes alone): Qwen's.
M.default_experts = require "loip.model.families.qwen_experts"

-- The sorted keys of t (for "supported: ..." messages).
function M.names(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

return M
