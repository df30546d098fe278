-- Take a described cluster down: stop what up.lua started (serve, then every worker: SIGTERM,
-- then SIGKILL) and remove what it made (copied prefixes, logs, caches it created, its state).
-- Nothing up: says so and succeeds. See docs/deploy.md.
--   loip run recipes/deploy/down.lua my-cluster.lua
local rc = require("loip.deploy").recipe("down", ...)
if rc ~= 0 then os.exit(rc) end
