-- `loip pull REPO`: a model repository from Hugging Face (or a compatible endpoint) into a
-- directory, resumable and verified (loip.model.pull does the work).
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local function usage(fmt, ...) require("loip.cli.inputs").usage("pull", fmt, ...) end

local M = {
  brief = "download a model repository from Hugging Face (or a compatible endpoint), resumable",
  usage = "loip pull REPO [--revision REV] [--endpoint URL] [--to DIR] [--include GLOB]... [flags]",
  positional = { "REPO" },
  summary = "Download a model repository (owner/name) from Hugging Face or a compatible endpoint into a\n"
    .. "directory that loip generate, slice and serve take. Files are listed through the Hub's API, each\n"
    .. "written as PATH.incomplete, verified (Git LFS files: their sha256; others: their size) and renamed\n"
    .. "into place; files already there and verified are skipped. An interrupted pull leaves only\n"
    .. "*.incomplete files: pull again and it resumes them (HTTP Range).",
  flags = {
    { "revision", "string", "branch, tag or commit", default = "main", metavar = "REV" },
    { "endpoint", "string", "the Hub's address (default $HF_ENDPOINT, else https://huggingface.co)", metavar = "URL" },
    { "to", "string", "directory to write into (default models/NAME, NAME the part of REPO after the slash)", metavar = "DIR" },
    { "include", "string", "only the files whose path matches this shell glob (* and ? match / too); repeatable, "
      .. "e.g. --include '*.json' --include '*.safetensors'", metavar = "GLOB" },
    { "retries", "int", "within this pull, resume a file whose transfer fails this many times in a row", default = 4, metavar = "N",
      check = function(v) return v >= 0, "must be >= 0" end },
    { "quiet", "bool", "no progress, no per-file lines" },
    { "json", "bool", "print one JSON object: repo, revision, dir, files (path, size, sha256, action), bytes" },
  },
  epilog = "environment: HF_TOKEN, a token sent as \"Authorization: Bearer\" to the endpoint's host only (never\n"
    .. "printed); HF_ENDPOINT, the endpoint when --endpoint is not given.\n"
    .. "example: loip pull karpathy/tinyllamas --include 'stories260K/*' --to models/tinyllamas",
}

-- Every --include of the command line (flags.parse keeps the last of a repeated flag).
local function includes(argv)
  local takes_value = {}
  for _, f in ipairs(M.flags) do takes_value[f[1]] = f[2] ~= "bool" end
  local out, i = {}, 2
  while i <= #argv do
    local a = argv[i]
    if a == "--" then break end
    local name, value = a:match("^%-%-([^=]+)=(.*)$")
    if name == "include" then
      out[#out + 1] = value
    elseif a == "--include" then
      out[#out + 1] = argv[i + 1]
      i = i + 1
    elseif not name and takes_value[a:match("^%-%-(.*)$") or ""] then
      i = i + 1 -- another flag's value, even one that reads like a flag
    end
    i = i + 1
  end
  return out
end

function M.run(o, pos, argv)
  local pull = require "loip.model.pull"
  if not pos[1] or pos[2] then usage("one REPO, owner/name (see --help)") end
  local ok, why = pull.check_repo(pos[1])
  if not ok then usage("%s", why) end
  if o.endpoint then
    ok, why = pull.check_endpoint(o.endpoint)
    if not ok then usage("--endpoint: %s", why) end
  elseif os.getenv("HF_ENDPOINT") and os.getenv("HF_ENDPOINT") ~= "" then
    ok, why = pull.check_endpoint(os.getenv("HF_ENDPOINT"))
    if not ok then usage("HF_ENDPOINT: %s", why) end
  end
  local include = argv and includes(argv) or {}
  if #include == 0 and o.include then include = { o.include } end
  for _, g in ipairs(include) do
    if g == "" then usage("--include: an empty glob") end
  end
  local r, err = pull.pull { repo = pos[1], revision = o.revision, endpoint = o.endpoint, to = o.to, include = include,
    quiet = o.quiet, retries = o.retries }
  if not r then error(err, 0) end
  if o.json then
    io.stdout:write(require("loip.text.json").encode(r), "\n")
    return 0
  end
  local human = require("loip.ui.progress").human
  io.stdout:write(string.format("%s@%s -> %s: %d file%s, %d downloaded (%s), %d already present\n", r.repo, r.revision,
    r.dir, #r.files, #r.files == 1 and "" or "s", r.downloaded, human(r.bytes), r.present))
  return 0
end

return M
