"""Performance model of one serving step on an emulated GPU.

The emulated executor asks a profile how long a vLLM step (one forward pass over a batch of
prefill chunks and decoding sequences) would take on a given GPU and model, and how many tokens
of KV cache the GPU would hold. Pure Python: no vLLM, no torch (numpy/scipy only for fitting
measured tables), so it runs inside vLLM's EngineCore on a CPU-only machine and in the
virtual-time engine alike. One module per job; import a name from the module that owns it:

* `hardware`: the GPU catalogue, vLLM's serving defaults on each GPU, the efficiency
  assumptions, the interconnect links between replicas (`Link`, `NVLINK`, `INFINIBAND`).
* `copy_model`: how long the offloading connector's copies to and from host memory take.
* `model_shapes`: a model's parameters, weight and KV bytes from its config.json.
* `step_form`: the step-time form both kinds of profile share and its batch features.
* `profile`: the `Profile` base: KV capacity, copies, all-reduces, reloads.
* `roofline`: `RooflineProfile`, step times from datasheets (names like ``h100-llama-3.1-8b``).
* `fit`: the non-negative least-squares fit of the form to measured steps.
* `table`: `TableProfile`, measured step-time tables read (and written) as JSON.
* `registry`: `load_profile` and the profile names.

All constants, their sources and the efficiency assumptions are in docs/emulated-gpu.md.
"""
