-- Speculative decoding, sampled (docs/serving.md, "Speculative decoding"): the first three
-- tokens over 2,000 seeds distributed as without drafts (a chi-square test of homogeneity,
-- p > 0.001), for chains, best-first trees of 63 nodes in the head's process and trees built on a
-- worker (--draft-device). Lua-only (CMakeLists.txt, LOIP_LUA_ONLY_SPECS): the C these reach, the
-- sampler and the verification of chains and trees on one device and on a worker, runs sanitized
-- in speculative_spec's seeded streams and speculative_tree_worker_spec; here it runs 6,000 times
-- more for the statistics, which a sanitizer would only slow.
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"
local greedy = json.load(T.root .. "/models/stories260K/reference/greedy.json")

local function store() return T.slice_store(S260, "s260") end

-- log Γ(x) (Lanczos, g = 7, n = 9), for the chi-square distribution's tail.
local LANCZOS = { 0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
  -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7 }
local function lgamma(x)
  x = x - 1
  local a, t = LANCZOS[1], x + 7.5
  for i = 2, 9 do a = a + LANCZOS[i] / (x + i - 1) end
  return 0.5 * math.log(2 * math.pi) + (x + 0.5) * math.log(t) - t + math.log(a)
end

-- Q(a, x) = Γ(a, x) / Γ(a): a series below a + 1, a continued fraction above (Lentz).
local function gamma_q(a, x)
  if x <= 0 then return 1 end
  local lead = -x + a * math.log(x) - lgamma(a)
  if x < a + 1 then
    local sum, term, n = 1 / a, 1 / a, a
    repeat n = n + 1 term = term * x / n sum = sum + term until math.abs(term) < math.abs(sum) * 1e-15
    return 1 - sum * math.exp(lead)
  end
  local tiny = 1e-300
  local b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
  local h = d
  for i = 1, 1000 do
    local an = -i * (i - a)
    b = b + 2
    d = an * d + b
    if math.abs(d) < tiny then d = tiny end
    c = b + an / c
    if math.abs(c) < tiny then c = tiny end
    d = 1 / d
    local del = d * c
    h = h * del
    if math.abs(del - 1) < 1e-15 then break end
  end
  return math.exp(lead) * h
end

-- Two samples of categories (value -> count, n each): the chi-square test of homogeneity's p,
-- categories expected fewer than 5 times pooled into one.
local function homogeneity_p(a, b)
  local na, nb = 0, 0
  for _, v in pairs(a) do na = na + v end
  for _, v in pairs(b) do nb = nb + v end
  local keys, pooled = {}, { 0, 0 }
  for k in pairs(a) do keys[k] = true end
  for k in pairs(b) do keys[k] = true end
  local cells = {}
  for k in pairs(keys) do
    local x, y = a[k] or 0, b[k] or 0
    if (x + y) * math.min(na, nb) / (na + nb) < 5 then pooled[1], pooled[2] = pooled[1] + x, pooled[2] + y
    else cells[#cells + 1] = { x, y } end
  end
  if pooled[1] + pooled[2] > 0 then cells[#cells + 1] = pooled end
  local chi = 0
  for _, c in ipairs(cells) do
    local tot = c[1] + c[2]
    local ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    chi = chi + (c[1] - ea) ^ 2 / ea + (c[2] - eb) ^ 2 / eb
  end
  local dof = #cells - 1
  if dof < 1 then return 1, chi, dof end
  return gamma_q(dof / 2, chi / 2), chi, dof
end

describe("speculative decoding, sampling", function()
  it("tests homogeneity correctly (a check of the test itself)", function()
    assert.is_true(homogeneity_p({ a = 500, b = 500 }, { a = 500, b = 500 }) > 0.99)
    assert.is_true(homogeneity_p({ a = 600, b = 400 }, { a = 400, b = 600 }) < 1e-6)
    -- chi-square 3.841 on 1 degree of freedom is p = 0.05; 11.07 on 5 is 0.05
    assert.is_true(math.abs(gamma_q(0.5, 3.841 / 2) - 0.05) < 1e-3)
    assert.is_true(math.abs(gamma_q(2.5, 11.07 / 2) - 0.05) < 1e-3)
  end)

  -- a prompt that repeats itself, so that ngram has something to propose from the start
  local seq = greedy.cases[2].generated_ids
  local PROMPT = { 1 }
  for i = 1, 30 do PROMPT[#PROMPT + 1] = seq[i] end
  for i = 10, 24 do PROMPT[#PROMPT + 1] = seq[i] end

  -- The first three tokens of `n` requests seeded seed0 + 1 .. seed0 + n at temperature 2 (the
  -- repeated prompt makes the first two nearly certain at 1: every draft would be accepted or none).
  local function first_three(draft, seed0, n, k)
    local m = loip.model.open(store(), { context = 256, threads = 1, draft = draft, draft_tokens = draft and (k or 3) or nil })
    local out = { {}, {}, {} }
    for s = seed0 + 1, seed0 + n do
      local it, st = m:generate(PROMPT, { max_tokens = 3, sampler = { temperature = 2, top_p = 1 }, seed = s, stop = {} })
      for _ in it do end
      for j = 1, 3 do
        local id = st.token_ids[j]
        out[j][id] = (out[j][id] or 0) + 1
      end
    end
    local r = m:batcher().draft and m:batcher().draft:report()
    m:close()
    return out, r
  end

  it("draws the first 3 tokens as without drafts over 2,000 seeds (self, self:layers=3 and ngram; chi-square p > 0.001)", function()
    local base = first_three(nil, 0, 2000)
    for i, d in ipairs({ "self", "self:layers=3", "ngram" }) do
      local got, r = first_three(d, 10000 * i, 2000)
      -- drafts were verified, and some of them rejected: both paths of verification ran
      assert.is_true(r.accepted > 0 and r.accepted < r.drafted, string.format("%s: %d of %d accepted", d, r.accepted, r.drafted))
      for j = 1, 3 do
        local p, chi, dof = homogeneity_p(base[j], got[j])
        assert.is_true(p > 0.001, string.format("%s, token %d: chi-square %.1f on %d degrees of freedom, p = %.2g", d, j, chi, dof, p))
      end
    end
  end)

  it("draws the first 3 tokens as without drafts over 2,000 seeds with best-first trees of 63 nodes (chi-square p > 0.001)", function()
    local base = first_three(nil, 0, 2000)
    -- (3 tokens: a tree after the first is 1 deep, the draft's 63 likeliest tokens as siblings)
    local got, r = first_three("self:layers=3,tree=on,children=63", 50000, 2000, 63)
    assert.is_true(r.accepted > 0 and r.tree_size_max == 63, string.format("%d accepted, trees of %d", r.accepted, r.tree_size_max))
    for j = 1, 3 do
      local p, chi, dof = homogeneity_p(base[j], got[j])
      assert.is_true(p > 0.001, string.format("token %d: chi-square %.1f on %d degrees of freedom, p = %.2g", j, chi, dof, p))
    end
  end)

  it("draws the first 3 tokens as without drafts over 2,000 seeds with trees of 63 nodes built on a worker (--draft-device 2; chi-square p > 0.001)", function()
    local base = first_three(nil, 0, 2000)
    local c = cluster.start_local { store = store(), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      c:plan { context = 256, batch = 512, max_batch = 8, stages = 2,
        draft = loip.policy.load("draft", "self:layers=3,tree=on,children=63,device=2"), draft_tokens = 63 }
      local b = c:batcher()
      local got = { {}, {}, {} }
      -- (8 requests at a time: their trees built together on the device, a draft forward a round)
      for s0 = 70000, 70000 + 1999, 8 do
        local reqs = {}
        for s = s0, s0 + 7 do
          reqs[#reqs + 1] = b:submit { prompt = PROMPT, max_tokens = 3, sampler = { temperature = 2, top_p = 1 }, seed = s, stop = {} }
        end
        b:drain()
        for _, r in ipairs(reqs) do
          for j = 1, 3 do
            local id = r.token_ids[j]
            got[j][id] = (got[j][id] or 0) + 1
          end
        end
      end
      local r = b.draft:report()
      assert.are.equal(2, b.draft.ctx.drafter.i, "the draft ran on device 2")
      assert.is_true(r.accepted > 0 and r.accepted < r.drafted and r.tree_size_max == 63,
        string.format("%d of %d accepted, trees of %d", r.accepted, r.drafted, r.tree_size_max))
      for j = 1, 3 do
        local p, chi, dof = homogeneity_p(base[j], got[j])
        assert.is_true(p > 0.001, string.format("token %d: chi-square %.1f on %d degrees of freedom, p = %.2g", j, chi, dof, p))
      end
      b.draft:close()
    end)
    c:close()
    assert(ok, err)
  end)
end)
