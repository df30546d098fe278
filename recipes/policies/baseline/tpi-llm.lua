-- TPI-LLM (Li et al., "TPI-LLM: Serving 70B-scale LLMs Efficiently on Low-resource Edge Devices",
-- 2024) without its memory scheduler, as the LOIP paper's "TPI-LLM": tensor parallelism with the
-- layers split evenly, star all-reduces through the master device (TPI-LLM's choice where link
-- latency dominates) after each attention and each MLP; every device holds its whole slice.
return require("loip.sim.tp").model { name = "tpi-llm", split = "even", allreduce = "star", offload = false }
