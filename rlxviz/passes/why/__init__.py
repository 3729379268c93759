"""Why a run fused as it did: one verdict per run (`verdict.RunVerdict.of(trace)`), decided here and only here.

* `kinds`: what kind a layer is (`LayerArchitecture`; `passes.architecture` classifies);
* `policy`: what a layer of each kind is expected to fuse, and which refusals do not count there;
* `facts`: what the run did, gathered once per trace (misses, products, the canonical reference run);
* `verdict`: `RunVerdict` / `LayerVerdict`, the frozen answer every front end formats;
* `standing`: a refusal's standing (near-miss or not, and in which group), read per refusal;
* `held`: a place held by the model's own term (`Held`), the record `standing` and `excused` word it from;
* `text`: the CLI's wording of it (`explain` text and `--json`).

The package imports none of them itself (the classifier imports `kinds`, and `verdict` imports the classifier).
"""
