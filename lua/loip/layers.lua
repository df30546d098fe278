-- loip's Lua layers, bottom first: which part of lua/loip/ (and recipes/) may require which.
-- A module may require the modules of its own layer and of every layer below it, never one
-- above (a lower layer that needs something of a higher one is passed a function, or the
-- shared piece moves down). Requires go round no cycle, inside a layer either.
-- spec/unit/layering_spec.lua reads every require in lua/ and recipes/ (those inside functions
-- too) against this table, and checks that docs/design.md's table (§1, "Lua layers") is this one.
--
-- parts: "loip.x.*" is every module under lua/loip/x/ (lua/loip/x/init.lua is "loip.x", named
-- on its own where it sits elsewhere); "loip.x.y" one module, which wins over its folder;
-- "recipes/*" every file under recipes/. Plain data: this module requires nothing.
return {
  { name = "core", parts = { "loip.core", "loip.cdef", "loip.constants", "loip.build_config", "loip.layers", "loip.error" },
    holds = "the FFI's one handle on the C runtime, what the build generates, and the error value" },
  { name = "base", parts = { "loip.ui.*", "loip.measure.stats" },
    holds = "small helpers: flags and their help, did-you-mean hints, progress bars, statistics" },
  { name = "runtime", parts = { "loip.runtime.*" },
    holds = "one thin wrapper per C object (and the HTTP client, the shell's file commands)" },
  { name = "formats", parts = { "loip.text.*", "loip.model.*", "loip.plan", "loip.plan.sizes", "loip.plan.space",
    "loip.plan.ends" },
    holds = "model formats, slice stores and the slicer; tokenizers, chat templates, grammars, JSON; the plan table and its memory" },
  { name = "plan", parts = { "loip.plan.*" },
    holds = "planning: problems, profiles, calibrations, the disk's figures" },
  { name = "policy", parts = { "loip.policy" },
    holds = "the loader of the policies in recipes/policies/ (and the planning call over them)" },
  { name = "engine", parts = { "loip.engine.*", "loip.model", "loip.model.experts", "loip.model.kernels", "loip.model.part", "loip.sim.*" },
    holds = "the engines (one device, a ring, the simulator), their timelines, the request engine, loip.model itself and a device's part of it" },
  { name = "cluster", parts = { "loip.cluster.*" },
    holds = "the head and its members, the workers, RPC, shipping, discovery, the testbed" },
  { name = "serve", parts = { "loip.serve.*" },
    holds = "the HTTP API and its formats: server, OpenAI, Anthropic, tool calls, metrics, dashboard" },
  { name = "measure", parts = { "loip.measure.*" },
    holds = "benchmark helpers, plots, leak checks" },
  { name = "front", parts = { "loip.cli.*", "loip.cmd.*", "loip.deploy.*", "loip", "loip.sim.experiments" },
    holds = "the command line (dispatch, REPL, one file a command), deployments, `require \"loip\"`, the paper's experiments" },
  { name = "recipes", parts = { "recipes/*" },
    holds = "policies, benchmarks, the paper's figures: may require any module" },
}
