-- Chat templates: the model's own `chat_template` (tokenizer_config.json, or a file given
-- explicitly) rendered with loip.template in the environment transformers uses.
--
--   local text = chat.apply(dir, { { role = "user", content = "Hi" } }, { add_generation_prompt = true })
local json = require "loip.text.json"
local shell = require "loip.runtime.shell"
local gguf = require "loip.model.gguf"
local template = require "loip.text.template"

local M = {}

local function read(path)
  local text, err = json.read_file(path)
  if not text then error(path .. ": " .. tostring(err), 0) end
  return text
end

-- A special token as tokenizer_config.json writes it: a string, or an AddedToken object.
local function token_text(v)
  if type(v) == "string" then return v end
  if type(v) == "table" and type(v.content) == "string" then return v.content end
  return nil
end

-- The GGUF whose metadata holds dir's template: dir itself (a .gguf file), or the
-- tokenizer.gguf of a slice store made from one; nil for a Hugging Face directory.
local function gguf_of(dir)
  if dir:match("%.gguf$") and json.exists(dir) then return dir end
  if not json.exists(dir .. "/tokenizer_config.json") and json.exists(dir .. "/tokenizer.gguf") then
    return dir .. "/tokenizer.gguf"
  end
end

-- What chat needs from a GGUF's metadata ({ templates = key -> text, specials }), by path and
-- size (a server renders one per request; reading a vocabulary of 150K tokens each time would
-- cost more than the rendering).
local gguf_cache = {}
local function gguf_facts(path)
  local key = path .. "\0" .. tostring(shell.size(path))
  if gguf_cache[key] then return gguf_cache[key] end
  local g = gguf.open(path)
  local md = g.metadata
  g:close()
  local facts = { templates = {}, specials = {} }
  for k, v in pairs(md) do
    if (k == "tokenizer.chat_template" or k:match("^tokenizer%.chat_template%.")) and type(v) == "string" then
      facts.templates[k] = v
    end
  end
  local tokens = md["tokenizer.ggml.tokens"]
  for k, key2 in pairs({ bos_token = "bos", eos_token = "eos", unk_token = "unknown", pad_token = "padding" }) do
    local id = md["tokenizer.ggml." .. key2 .. "_token_id"]
    if type(id) == "number" and type(tokens) == "table" and type(tokens[id + 1]) == "string" then
      facts.specials[k] = tokens[id + 1]
    end
  end
  gguf_cache[key] = facts
  return facts
end

-- A GGUF's template (tokenizer.chat_template, or tokenizer.chat_template.<name>) and its
-- special tokens' texts; opts.template_file instead of the metadata's template.
local function load_gguf(path, opts)
  local facts = gguf_facts(path)
  if opts.template_file then return read(opts.template_file), facts.specials end
  local tkey = opts.name and opts.name ~= "default" and ("tokenizer.chat_template." .. opts.name) or "tokenizer.chat_template"
  local text = facts.templates[tkey]
  if not text then
    error(string.format("%s: the model has no chat template (no %s in its metadata); pass one with --chat-template FILE",
      path, tkey), 0)
  end
  return text, facts.specials
end

-- The template text and the special tokens transformers would pass, for model directory dir
-- (or a GGUF file: the template in its metadata). opts.template_file: a .jinja file to use
-- instead; opts.name: which of several named templates (default "default").
function M.load(dir, opts)
  opts = opts or {}
  local gpath = gguf_of(dir)
  if gpath then return load_gguf(gpath, opts) end
  local cfg_path = dir .. "/tokenizer_config.json"
  local cfg = {}
  if json.exists(cfg_path) then
    local c, err = json.load(cfg_path)
    if not c then error(err, 0) end
    cfg = c
  end
  local text
  if opts.template_file then
    text = read(opts.template_file)
  else
    if not json.exists(cfg_path) and json.exists(dir .. "/chat_template.jinja") then
      text = read(dir .. "/chat_template.jinja")
    end
    local t = cfg.chat_template
    if type(t) == "string" then
      text = t
    elseif type(t) == "table" then -- a list of { name, template }
      local want = opts.name or "default"
      for _, e in ipairs(t) do
        if type(e) == "table" and e.name == want then text = e.template end
      end
      if not text then error(string.format("%s: no chat template named '%s'", cfg_path, want), 0) end
    elseif not text and json.exists(dir .. "/chat_template.jinja") then
      text = read(dir .. "/chat_template.jinja")
    end
  end
  if not text then
    error(string.format("%s: the model has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja); pass one with --chat-template FILE", dir), 0)
  end
  local specials = {}
  for _, k in ipairs({ "bos_token", "eos_token", "unk_token", "pad_token" }) do
    local v = token_text(cfg[k])
    if v then specials[k] = v end
  end
  if type(cfg.additional_special_tokens) == "table" then
    local list = {}
    for i, v in ipairs(cfg.additional_special_tokens) do list[i] = token_text(v) end
    specials.additional_special_tokens = list
  end
  return text, specials
end

-- Render messages with the model's template. opts: add_generation_prompt, tools, extra
-- variables (enable_thinking, date_string, ...) in opts.vars, template_file, name.
function M.apply(dir, messages, opts)
  opts = opts or {}
  local text, specials = M.load(dir, opts)
  local vars = { messages = messages, tools = opts.tools or template.null, documents = template.null,
    add_generation_prompt = opts.add_generation_prompt and true or false }
  for k, v in pairs(specials) do vars[k] = v end
  for k, v in pairs(opts.vars or {}) do vars[k] = v end
  local out, err = template.render(text, vars, { now = opts.now })
  if not out then error("chat template: " .. tostring(err), 0) end
  return out
end

return M
