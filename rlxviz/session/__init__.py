"""The service layer every front end calls: the CLI (`rlxviz.cli`), the notebooks' helpers
(`rlxviz.teach`) and the app's state (`rlxviz.app.state`).

One module per job:

* `defaults`: the shapes a model is built for and the timing rounds, one set for every front end.
* `limits`: one limits record (`Limits`, `RLXVIZ_MAX_MEMORY_MB`) checked before tensors are allocated.
* `variants`: the teaching variants (`models.VARIANTS`) and the shape rule of `over_threshold`.
* `loading`: a model from a preset, a checkpoint folder, an IR file or IR text, cached by content.
* `isolated`: the same load in a child process killed past its wall time, its address space capped.
* `opening`: one request (`OpenRequest`) in, the model, its pipeline and their run out (`open`): what the CLI and
  the app both call.
* `pipeline`: building a checked pipeline (`Pass.requires`), running it (cached), finding versions.
* `status`: "why didn't layer N fuse" (`layer_status`, `check_fusion`: the door to `passes.why.RunVerdict`).
* `timing`: time every version on MLX with a verdict from one tolerance table (`runtime.precision`).
* `render`: a drawing as a pure function of (trace, view), cached by the trace's content key.
* `traffic`: the memory traffic a pass's fusions removed (a model of MLX's own lowering, without rlxviz's
  CPU kernels).
* `program`: what the backend runs, read from the backend (MLX's primitives of a lowered version and the
  bytes they move, `ProgramBytes`).
* `roofline`: FLOPs, bytes moved and arithmetic intensity per op and per version.
* `lowerings`: one version under several MLX lowerings (e.g. `mx.compile` of each layer), timed in paired rounds.
* `numerics`: what the fused lowering changes in the numbers (fast-math erf, `mx.addmm`'s rounding), measured.
* `imported_forms` (`models.onnx.notes`): what an ONNX file had already fused (ONNX Runtime's optimizer) and its
  quantization steps, one line each: what `rlxviz explain` prints and the app's Why tab and load banner show.
* `describe_host`, `host_words` (`ir.onnx_op`): the nodes the IR has no op for, run on the host (ONNX Runtime), in
  one line (`rlxviz explain` and `rlxviz time`, the app's Why tab and load banner) and per node (the inspector).

Errors a user can fix are `SessionError`s (one line); front ends match them by type.
"""

from ..ir.onnx_op import describe_host, host_words
from ..ir.text import ModelText, shown
from ..models.onnx.notes import imported_forms
from ..passes.architecture import LayerArchitecture as Architecture
from ..passes.architecture import classify_layer as classify
from .defaults import DEFAULT_BATCH, DEFAULT_REPEAT, DEFAULT_SEQ, DEFAULT_WARMUP, MAX_REPEAT, MAX_WARMUP, check_rounds
from .dimroles import check_dims, dims_overrides, override_notes
from .errors import (
    CLI_DIMS,
    DimsMisfitError,
    DimsWords,
    GraphTextError,
    InputDimsError,
    LimitError,
    PipelineError,
    SessionError,
    StoppedError,
    UnboundDimsError,
    VariantLayerError,
)
from .inputs import check_inputs, feeds, index_bounds, load_inputs, npz_headers
from .isolated import load_isolated, run_isolated
from .limits import DEFAULT_MAX_MEMORY_MB, DEPRECATED_MEMORY_ENV, MAX_MEMORY_ENV, Limits, human_bytes
from .loading import (
    default_preset,
    load,
    load_ir_file,
    load_ir_text,
    model_layers,
    presets,
    shape_summary,
    unknown_model,
)
from .lowerings import FusionAndKernels, Lowering, fusion_and_kernels, time_lowerings
from .numerics import AddmmRounding, addmm_rounding, fast_erf_error
from .opening import Opened, OpenRequest, check_workload, open, open_model, open_pipeline, open_trace
from .pipeline import build_pipeline, format_passes, pass_catalog, run_pipeline, version_index
from .program import (
    KernelBytes,
    ProgramBytes,
    ProgramPrimitives,
    VersionPrimitives,
    format_primitives,
    mlx_primitives,
    short_primitive,
    version_primitives,
)
from .render import View
from .roofline import (
    ERF_FLOPS,
    OpCost,
    Ridge,
    VersionRoofline,
    attainable_ms,
    bound,
    graph_flops,
    machine_ridge,
    op_costs,
    program_bytes,
    roofline,
)
from .status import FusionCheck, LayerStatus, check_fusion, check_layer, layer_status
from .timing import (
    PairedVerdict,
    VersionTiming,
    all_finite,
    busy_warning,
    compare_to_input,
    compare_versions,
    input_sets,
    nonfinite_arrays,
    paired_verdict,
    time_versions,
    timing_table,
)
from .timing_text import format_timings
from .traffic import (
    ExecutedTraffic,
    Traffic,
    executed_traffic_saved,
    runs_as,
    sdpa_fused,
    shared_input_saved,
    traffic_saved,
)
from .variants import (
    MODEL_WIDE,
    OVER_THRESHOLD,
    RLX_THRESHOLD,
    effective_seq,
    effective_threshold,
    gate_note,
    preset_is_bert,
    teaching_cases,
    variant_named,
    variant_note,
    variant_unavailable,
)

__all__ = ["ModelText", "shown", "imported_forms", "describe_host", "host_words",
           "DEFAULT_BATCH", "DEFAULT_MAX_MEMORY_MB", "DEFAULT_REPEAT", "DEFAULT_SEQ", "DEFAULT_WARMUP",
           "DEPRECATED_MEMORY_ENV", "MAX_MEMORY_ENV", "MAX_REPEAT", "MAX_WARMUP", "check_rounds",
           "MODEL_WIDE", "OVER_THRESHOLD", "RLX_THRESHOLD", "gate_note", "variant_note",
           "Architecture", "CLI_DIMS", "DimsMisfitError", "DimsWords", "FusionCheck", "GraphTextError",
           "InputDimsError",
           "LayerStatus", "LimitError", "Limits",
           "PipelineError",
           "SessionError", "StoppedError", "UnboundDimsError", "VariantLayerError", "load_isolated", "run_isolated",
           "ExecutedTraffic", "Traffic", "VersionTiming", "compare_to_input",
           "executed_traffic_saved", "runs_as", "shared_input_saved", "View", "all_finite", "build_pipeline",
           "check_fusion",
           "check_layer",
           "check_inputs", "classify", "default_preset", "effective_seq", "effective_threshold", "feeds",
           "format_passes", "format_timings", "human_bytes", "input_sets", "layer_status", "load", "load_inputs",
           "npz_headers", "index_bounds",
           "load_ir_file", "load_ir_text", "model_layers", "nonfinite_arrays", "pass_catalog",
           "preset_is_bert", "presets", "run_pipeline", "shape_summary", "teaching_cases", "time_versions",
           "traffic_saved",
           "unknown_model", "variant_named", "variant_unavailable", "version_index",
           "OpCost", "Ridge", "VersionRoofline", "graph_flops", "machine_ridge", "op_costs", "program_bytes",
           "roofline", "ProgramPrimitives", "VersionPrimitives", "format_primitives", "mlx_primitives",
           "short_primitive", "version_primitives", "KernelBytes", "ProgramBytes", "sdpa_fused", "ERF_FLOPS",
           "attainable_ms", "bound",
           "PairedVerdict", "busy_warning", "compare_versions", "paired_verdict", "timing_table",
           "FusionAndKernels", "Lowering", "fusion_and_kernels", "time_lowerings",
           "AddmmRounding", "addmm_rounding", "fast_erf_error",
           "check_dims", "dims_overrides", "override_notes",
           "OpenRequest", "Opened", "check_workload", "open", "open_model", "open_pipeline", "open_trace"]
