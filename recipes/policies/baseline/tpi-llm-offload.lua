-- TPI-LLM with its sliding-window memory scheduler, as the LOIP paper's "TPI-LLM+offloading": as
-- tpi-llm, but the slices a device cannot hold are read from disk every step, a window of two
-- layers' slices in memory, prefetched while the layers before compute.
return require("loip.sim.tp").model { name = "tpi-llm-offload", split = "even", allreduce = "star", offload = true, window = 2 }
