-- generate --chat: the model's own template renders the conversation, and its text is what
-- gets tokenized (with no special tokens added on top).
local json = require "loip.text.json"
local T = require "spec.support"

local function model_with_template(template)
  local dir = T.tmpdir()
  os.execute(string.format("cp %s/models/stories260K-hf/config.json %s/models/stories260K-hf/model.safetensors %s/",
    T.root, T.root, dir))
  os.execute(string.format("cp %s/models/stories260K/tok512.bin %s/tokenizer.bin", T.root, dir))
  if template then T.write(dir .. "/tokenizer_config.json", json.encode({ chat_template = template, eos_token = "</s>" })) end
  return dir
end

describe("loip generate --chat", function()
  after_each(function() T.cleanup() end)

  it("renders the model's template and generates from it", function()
    local dir = model_with_template("{% for m in messages %}{% if m.role == 'system' %}{{ m.content }} {% else %}{{ m.content | trim }}{% endif %}{% endfor %}{% if add_generation_prompt %} Then{% endif %}")
    local rc, out, err = T.run(string.format("%s generate --model %s --chat --system 'Lily smiled.' --prompt ' Once upon a time ' --temperature 0 --max-tokens 8 --json",
      T.loip, dir))
    assert.are.equal(0, rc, err)
    local r = json.decode(out)
    local tok = require("loip.text.tokenizer").open(dir, { vocab_size = 512 })
    assert.are.same(tok:encode("Lily smiled. Once upon a time Then", { bos = false }), r.prompt_ids)
    assert.are.equal(8, #r.token_ids)
  end)

  it("takes an explicit template file, and says so when the model has none", function()
    local dir = model_with_template(nil)
    local rc, _, err = T.run(string.format("%s generate --model %s --chat --prompt hi", T.loip, dir))
    assert.are.equal(1, rc)
    assert.matches("has no chat template", err, 1, true)
    T.write(dir .. "/t.jinja", "{{ messages[0].content }}!")
    local out
    rc, out, err = T.run(string.format("%s generate --model %s --chat-template %s/t.jinja --prompt hi --max-tokens 1 --json", T.loip, dir, dir))
    assert.are.equal(0, rc, err)
    local tok = require("loip.text.tokenizer").open(dir, { vocab_size = 512 })
    assert.are.same(tok:encode("hi!", { bos = false }), json.decode(out).prompt_ids)
  end)

  it("reports a template error with its message", function()
    local dir = model_with_template("{{ raise_exception('roles must alternate') }}")
    local rc, _, err = T.run(string.format("%s generate --model %s --chat --prompt hi", T.loip, dir))
    assert.are.equal(1, rc)
    assert.matches("chat template: roles must alternate", err, 1, true)
  end)
end)

describe("tok:apply_chat_template", function()
  after_each(function() T.cleanup() end)

  it("renders the directory's template and tokenizes it without extra specials", function()
    local dir = model_with_template("[{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}]{% if enable_thinking %}think{% endif %}")
    local tok = require("loip.text.tokenizer").open(dir, { vocab_size = 512 })
    local msgs = { { role = "user", content = "hi" }, { role = "assistant", content = "yo" } }
    assert.are.equal("[user:hi;assistant:yo;]think", tok:apply_chat_template(msgs, { vars = { enable_thinking = true } }))
    assert.are.same(tok:encode("[user:hi;assistant:yo;]", { bos = false }), tok:apply_chat_template(msgs, { tokenize = true }))
  end)
end)
