-- Bring a described cluster up: loip copied where it is missing, a worker on every host (over
-- ssh or in a testbed namespace), then `loip serve --hosts ...` here, the head. What it starts and
-- makes is recorded (the description's state_dir) for down.lua. See docs/deploy.md.
--   loip run recipes/deploy/up.lua my-cluster.lua
local rc = require("loip.deploy").recipe("up", ...)
if rc ~= 0 then os.exit(rc) end
