"""What decides whether a CPU lookup-table entry (a ``zhantune::config`` patch of Inductor's C++ GEMM
template knobs) can take effect in this compile, and the reasons a table's report gives when it
cannot (zhantune.inductor.table_choices serves the table; zhantune.inductor.runtime has the rules).
"""

from __future__ import annotations

import math
from typing import Any

from torch._inductor import config as inductor_config

from zhantune.inductor.table import CONFIG_TEMPLATE_ID, not_carried

__all__ = ["NOT_FROZEN", "GRAD_ON", "frozen_compile", "BMM_RUNTIME_OPERAND", "BMM_SHARED_OUTPUT", "RUNTIME_OPERAND", "bmm_stale", "constant_operand", "PREPACK_OFF", "ISA_MISMATCH", "isa_mismatch", "OTHER_ISA", "OTHER_CPU", "other_isa", "DYNAMIC_M", "GPU_ENTRY_ON_CPU", "LEGACY_CPU_KEY", "REDUCED_FLOAT32", "cpp_template_applies",
           "dynamic_m", "cpu_entry", "reduced_float32", "threads_mismatch", "wants_cpp", "TRANSPOSED_INPUT",
           "CPP_NOT_OFFERED", "UNHOOKED_LOWERING", "strided_input", "cpp_unoffered", "CPP_KNOB_DEFAULTS", "cpp_knobs", "cpp_entry_stale"]

#: the C++ template's knobs at Inductor's source defaults (torch/_inductor/config.py, without its
#: TORCHINDUCTOR_CPP_GEMM_* environment variables): a C++-template entry compiles under these for
#: every knob it leaves out, never under the user's own value (a user's thread factors for another
#: thread count failed the compile with a hit in the report; their cache blocking compiled another
#: kernel than the report named). A tune's entries set all three.
CPP_KNOB_DEFAULTS: dict[str, Any] = {"cpp.gemm_max_k_slices": 1, "cpp.gemm_cache_blocking": None,
                                     "cpp.gemm_thread_factors": None}


def cpp_knobs(patch: dict[str, Any]) -> dict[str, Any]:
    """A C++-template entry's ``config_patch`` with :data:`CPP_KNOB_DEFAULTS` for the knobs it leaves out."""
    return {**CPP_KNOB_DEFAULTS, **patch}

#: why a C++-template entry compiled Inductor's default instead (TableReport.stale)
NOT_FROZEN = ("the C++ template needs a frozen constant weight: set torch._inductor.config.freezing = True and "
              "compile under torch.no_grad() (in torch 2.13 torch.compile(options={'freezing': True}) does not freeze)")
#: why a C++ BMM entry compiled Inductor's default where its second operand is computed at run time
BMM_RUNTIME_OPERAND = ("the tune measured the C++ BMM template on a constant second operand (a frozen weight, "
                       "blocked when compiled); here it is computed at run time (e.g. attention's keys), another "
                       "kernel no measurement covers: Inductor's default compiled")
#: why a C++-template entry compiled Inductor's default where freezing is on but the compile ran with
#: autograd on (a first call outside torch.no_grad(): a helper's saw RUNTIME_OPERAND for a Linear's weight)
GRAD_ON = ("this compile ran with autograd on (not under torch.no_grad()), so Inductor did not freeze the weights "
           "although torch._inductor.config.freezing is set (torch/_inductor/compile_fx.py freezes only with grad "
           "mode off): the C++ template needs a frozen constant weight; Inductor's default compiled (for inference, "
           "call the compiled model under torch.no_grad(); a training compile is never frozen)")
#: why a C++-template mm / addmm entry compiled Inductor's default under freezing where the second
#: operand is not a weight (NOT_FROZEN advised the freezing already on)
RUNTIME_OPERAND = ("the GEMM's second operand is computed at run time here (not a frozen weight): Inductor's C++ "
                   "template needs a constant one; Inductor's default compiled")
#: why a C++ BMM entry compiled Inductor's default where the bmm's output has several uses: Inductor's
#: C++ BMM template with an epilogue fused and another use of its output fails to compile in torch 2.13
#: (cpp_gemm_template.py's copy_from_local_to_global_buffer_epilogue loads the 3-D buffer with a 2-D
#: index: "AssertionError" in ir.py's indexer), where the default compile works
BMM_SHARED_OUTPUT = ("the bmm's output is used more than once here (e.g. q @ k^T beside relu(q)): Inductor's C++ BMM "
                     "template fails to compile with an epilogue fused and another use of its output (torch 2.13, "
                     "cpp_gemm_template.py copy_from_local_to_global_buffer_epilogue): Inductor's default compiled")
#: why a C++-template entry compiled Inductor's default with weight prepacking off (TableReport.stale)
PREPACK_OFF = ("torch._inductor.config.cpp.weight_prepack is False in this process: Inductor offers its C++ GEMM "
               "template only with it (torch/_inductor/utils.py use_cpp_gemm_template), so the entry's kernel "
               "cannot be compiled; Inductor's default compiled")
#: why a C++-template entry compiled Inductor's default for a GEMM whose input is not row-contiguous
TRANSPOSED_INPUT = ("the GEMM's first input is not laid out as Inductor's C++ template needs (contiguous in its last "
                    "dimension; a bmm's contiguous, in float32 in each batch), e.g. a transposed input: Inductor does not offer "
                    "the template for it (torch/_inductor/utils.py use_cpp_gemm_template, use_cpp_bmm_template), so "
                    "the entry's kernel cannot be compiled; Inductor's default compiled")
#: why ... for any other reason Inductor's check gives (a dtype without a micro-kernel, a dynamic N or K)
CPP_NOT_OFFERED = ("Inductor does not offer its C++ GEMM template for this GEMM (torch/_inductor/utils.py "
                   "use_cpp_gemm_template: a dtype it has no micro-kernel for, or a dynamic N or K), so the entry's "
                   "kernel cannot be compiled; Inductor's default compiled")
#: why a C++-template entry compiled Inductor's default where M is dynamic (TableReport.stale)
DYNAMIC_M = ("M is dynamic in this compile: Inductor's C++ template then picks its blocking, thread split and "
             "K slices at run time (cpp_gemm_template.py), so the entry's measured kernel cannot be compiled; "
             "Inductor's default compiled (compile with static shapes for the tuned kernel)")
#: why a GPU template entry (triton::*, decompose_k, ...) compiled Inductor's default on CPU (TableReport.stale)
UNHOOKED_LOWERING = ("Inductor lowers this {op} outside the CPU GEMM lowerings zhantune sets a table's knobs in "
                     "(mm, addmm, bmm, a packed linear; not baddbmm, nor the GEMMs of a fused pattern such as "
                     "mm_plus_mm): the entry's config patch cannot take effect; Inductor's default compiled")
GPU_ENTRY_ON_CPU = ("{tid} is not a CPU choice (a GPU template, or none Inductor offers): Inductor's CPU GEMM "
                    "offers ATen and its C++ template only "
                    f"({CONFIG_TEMPLATE_ID} entries); Inductor's default compiled")
#: why ``[]`` under a key a CPU GEMM looks up is not a hit (a review's: it counted as one, 100% coverage,
#: with nothing of the table compiled)
EMPTY_ON_CPU = ("[] (\"nothing from this lookup\": a CUDA addmm's ATen key where its templates' key holds the "
                "entry) selects nothing on CPU, where a GEMM makes one lookup; Inductor's default compiled")
#: why an entry under a CPU key without a thread count is not used (zhantune.device.cpu_device_key)
LEGACY_CPU_KEY = ("keyed by the CPU model alone (a table made before zhantune keyed a CPU by its thread count too): "
                  "measured with an unknown number of threads, so not used on this CPU ({key}); upgrade the database "
                  "(python -m zhantune.db upgrade) and export the table again, or tune again here")

#: why a CPU entry compiled Inductor's default where the table's wrapper gives its device another ISA
OTHER_ISA = ("measured on a CPU of this name whose vector ISA (torch.backends.cpu.get_cpu_capability()) was {theirs}; "
             "here it is {mine} (another machine of one model name, or ATEN_CPU_CAPABILITY set: other C++ kernels "
             "and timings): Inductor's default compiled; tune here")


#: why a CPU entry compiled Inductor's default where the table's wrapper gives its device another cpuid
OTHER_CPU = ("measured on a CPU of this name that /proc/cpuinfo identified as {theirs}; this one is {mine} (another "
             "generation or variant under one model name, e.g. a cloud VM's \"AMD EPYC\" on Zen 4 and on Zen 5: other "
             "caches, other timings, a claim nobody measured here): Inductor's default compiled; tune here")


def other_isa(theirs: Any) -> str | None:
    """Why a CPU entry's device is another machine than this one, or None: the table's wrapper gives
    its CPU (``theirs``: its ``devices[]`` object, or None) a vector ISA (``isa``, the tuned device's
    torch.backends.cpu.get_cpu_capability()) other than this CPU's (OTHER_ISA), or a ``cpuid``
    (zhantune.device.cpuid: vendor, family, model) other than this one's (OTHER_CPU). A field the
    table or this machine lacks is not compared."""
    import torch

    from zhantune.device import cpu_identity_mismatch, cpuid

    other = cpu_identity_mismatch(theirs, {"isa": torch.backends.cpu.get_cpu_capability(), "cpuid": cpuid()})
    if other is None:
        return None
    field, theirs_value, mine = other
    return (OTHER_ISA if field == "isa" else OTHER_CPU).format(theirs=theirs_value, mine=mine)


#: why a float32 CPU entry compiled Inductor's default in a process with oneDNN's reduced float32
#: math on (:func:`reduced_float32`)
REDUCED_FLOAT32 = ("this process runs float32 GEMMs with oneDNN's reduced-precision math "
                   "(torch.backends.mkldnn.matmul.fp32_precision is '{precision}', e.g. after "
                   "torch.set_float32_matmul_precision('high')): Inductor's default here is another kernel than "
                   "the one the table's float32 entries were paired with (a linear packed for mkldnn._linear_pointwise, "
                   "not mkl._mkl_linear; ATen's bmm and mm on oneDNN where the CPU has that math); Inductor's default "
                   "compiled")


def reduced_float32(dtypes: list[str], packed: bool) -> str | None:
    """oneDNN's reduced float32 math mode ("bf16", "tf32") when a CPU GEMM of inputs of ``dtypes``
    (names, e.g. "float32") runs under it here, else None. A ``packed`` linear: whatever the CPU,
    Inductor's freezing pass then packs it for ``mkldnn._linear_pointwise`` instead of
    ``mkl._mkl_linear`` (torch/_inductor/fx_passes/mkldnn_fusion.py ``reduced_f32_matmul_enabled``).
    Another GEMM: where the CPU has the math, ATen's mm/bmm take oneDNN's path (bf16: oneDNN's bf16
    support; tf32: AMX-FP16; aten/src/ATen/native/mkldnn/Matmul.cpp), else nothing changes."""
    import torch

    precision = torch.backends.mkldnn.matmul.fp32_precision
    if "float32" not in dtypes or precision not in ("bf16", "tf32"):
        return None
    if packed:
        return precision
    has = torch.ops.mkldnn._is_mkldnn_bf16_supported() if precision == "bf16" else torch.cpu._is_amx_fp16_supported()
    return precision if has else None


#: why a C++-template entry compiled Inductor's default where Inductor compiles for another vector ISA
ISA_MISMATCH = ("Inductor compiles C++ kernels for {picked} in this process (torch._inductor.config.cpp.simdlen or "
                "ATEN_CPU_CAPABILITY), not for this CPU's {best} as a tune does: the entry's kernel would be another "
                "micro-kernel than the one measured (scalar loops for none); Inductor's default compiled")


def isa_mismatch() -> str | None:
    """ISA_MISMATCH filled in when Inductor's vector ISA here (``pick_vec_isa``: ``cpp.simdlen``, the
    ATEN_CPU_CAPABILITY environment variable) is not this CPU's best (what a tune compiles for, with
    neither set), else None (torch/_inductor/cpu_vec_isa.py)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list

    valid = valid_vec_isa_list()
    picked = pick_vec_isa()
    if valid and str(picked) != str(valid[0]):
        return ISA_MISMATCH.format(picked="no vector ISA" if not picked else str(picked), best=str(valid[0]))
    return None


def cpp_template_applies(kernel_inputs: Any, op_name: str) -> bool:
    """Whether Inductor offers its C++ GEMM (or BMM) template for this GEMM in this lowering: its own
    ``use_cpp_gemm_template`` / ``use_cpp_bmm_template`` (torch/_inductor/utils.py: max-autotune on,
    CPP in the backends, a constant second operand, a supported dtype)."""
    from torch._inductor.utils import use_cpp_bmm_template, use_cpp_gemm_template

    check = use_cpp_bmm_template if op_name == "bmm" else use_cpp_gemm_template
    try:
        with inductor_config.patch(max_autotune_gemm_backends="ATEN,CPP"):
            return bool(check(kernel_inputs.output_layout(), *kernel_inputs.mat1mat2()))
    except Exception:  # an input Inductor's check does not expect: not offered
        return False


def strided_input(kernel_inputs: Any, op_name: str = "mm") -> bool:
    """Whether the GEMM's first input has a fixed layout Inductor's C++ template does not take: a
    stride other than 1 in its last dimension (a transposed input: ``x.t()``; use_cpp_gemm_template's
    ``is_last_dim_stride1``), or for a bmm one neither contiguous nor, in float32, contiguous in each
    batch (use_cpp_bmm_template). A flexible layout Inductor freezes row-major, so that one is taken."""
    import torch
    from torch._inductor import ir

    try:
        mat1 = kernel_inputs.mat1mat2()[0]
        layout = mat1.get_layout()
    except (AttributeError, NotImplementedError):
        return False
    if isinstance(layout, ir.FlexibleLayout):
        return False
    if layout.stride[-1] != 1:
        return True
    if op_name != "bmm":
        return False
    size, stride = list(layout.size), list(layout.stride)
    each_batch = mat1.get_dtype() == torch.float32 and len(size) == 3 and stride[1] == size[2]
    return not (layout.is_contiguous() or each_batch)


def cpp_unoffered(kernel_inputs: Any, op_name: str = "mm") -> str:
    """Why Inductor did not offer its C++ template for an unpacked GEMM (:func:`cpp_template_applies`
    said no): PREPACK_OFF, TRANSPOSED_INPUT, NOT_FROZEN (not a bmm, whose second operand need not be
    constant, and a second operand that is not a constant module buffer), else CPP_NOT_OFFERED."""
    if not inductor_config.cpp.weight_prepack:
        return PREPACK_OFF
    if strided_input(kernel_inputs, op_name):
        return TRANSPOSED_INPUT
    if op_name == "bmm":
        return CPP_NOT_OFFERED
    if constant_operand(kernel_inputs):
        return CPP_NOT_OFFERED
    if frozen_compile():
        return RUNTIME_OPERAND  # frozen, yet not a weight (a review's)
    return GRAD_ON if inductor_config.freezing else NOT_FROZEN


def frozen_compile() -> bool:
    """Whether the graph Inductor is lowering has its weights frozen: ``config.freezing`` set, an
    inference graph (``V.graph.is_inference``: not a training graph's forward) and grad mode off
    (torch/_inductor/compile_fx.py freezes only when ``not torch.is_grad_enabled()``)."""
    import torch
    from torch._inductor.virtualized import V

    return bool(inductor_config.freezing and getattr(V.graph, "is_inference", False)
                and not torch.is_grad_enabled())


def constant_operand(kernel_inputs: Any) -> bool:
    """Whether the GEMM's second operand is a constant module buffer of the compile (a frozen weight)."""
    from torch._inductor import ir

    mat2 = kernel_inputs.mat1mat2()[1]
    mat2 = mat2.unwrap_view() if isinstance(mat2, ir.BaseView) else mat2
    return isinstance(mat2, ir.StorageBox) and mat2.is_module_buffer()


def bmm_stale(kernel_inputs: Any) -> str | None:
    """Why a C++ BMM entry cannot compile its measured kernel in the bmm being lowered, or None: a
    second operand computed at run time (BMM_RUNTIME_OPERAND), an output used more than once
    (BMM_SHARED_OUTPUT: ``V.graph.current_node``, the bmm's post-grad FX node)."""
    from torch._inductor.virtualized import V

    from zhantune.inductor.epilogue import shared_output

    if not constant_operand(kernel_inputs):
        return BMM_RUNTIME_OPERAND
    return BMM_SHARED_OUTPUT if shared_output(getattr(V.graph, "current_node", None)) else None


def dynamic_m(kernel_inputs: Any) -> bool:
    """Whether this GEMM's M is a symbol in this compile (a dynamic batch: the key holds its hint)."""
    m = kernel_inputs.mnk_symbolic()[0] if hasattr(kernel_inputs, "mnk_symbolic") else 0
    return not isinstance(m, int) and not getattr(m, "is_number", False)


def cpu_entry(entry: dict[str, Any], op_name: str) -> bool:
    """An entry that can take effect on CPU in a lookup of ``op_name``: a config patch, or the op's own
    ATen kernel (``aten::<op>``, Inductor's default; another name, "aten::does_not_exist", counted a hit)."""
    return entry["template_id"] in (CONFIG_TEMPLATE_ID, f"aten::{op_name}")


def threads_mismatch(patch: dict[str, Any], op_name: str) -> str | None:
    """Why a C++-template entry's ``cpp.gemm_thread_factors`` cannot run in this process, or None.
    Inductor asserts that their product is the number of threads it compiles for
    (torch/_inductor/codegen/cpp_gemm_template.py; ``parallel_num_threads``: ``cpp.threads``, else
    torch.get_num_threads()), and a tune picks factors for its own machine's count; its C++ BMM
    template runs each batch on one thread, and its kernel aborts the process when the factors ask
    for more ("Not all partitions are assigned", torch 2.13). Either way the entry is reported
    stale and Inductor's default compiled, as for a template that changed."""
    factors = patch.get("cpp.gemm_thread_factors")
    if factors is None:
        return None
    from torch._inductor.utils import parallel_num_threads

    want, have = math.prod(int(x) for x in str(factors).split(",")), parallel_num_threads()
    if op_name == "bmm" and want > 1:
        return (f"cpp.gemm_thread_factors={factors} on a bmm: Inductor's C++ BMM template runs each batch on "
                "one thread, and its kernel aborts the process with factors for more; Inductor's default compiled")
    if want == have:
        return None
    return (f"cpp.gemm_thread_factors={factors} is for {want} thread(s), this process compiles for {have} "
            "(torch.get_num_threads()); Inductor's default compiled")


def cpp_entry_stale(entry: dict[str, Any], kernel_inputs: Any, op_name: str, packed: bool,
                    tuned_here: bool) -> str | None:
    """Why a CPU entry cannot compile the kernel it was measured as in this GEMM's lowering, or None:
    a knob no CPU table carries (zhantune.inductor.table.not_carried); for a C++-template entry,
    thread factors for another count (:func:`threads_mismatch`), a dynamic M, on a ``packed`` linear
    prepacking off or a transposed input (the unpacked lowering asks Inductor itself:
    :func:`cpp_unoffered`), and where ``tuned_here`` (a table, not a tune's own candidate compile)
    another vector ISA (:func:`isa_mismatch`). The one list of both lowerings, in this order."""
    if why := not_carried(entry, "cpu"):
        return why
    if not wants_cpp(entry):
        return None
    return (threads_mismatch(entry["config_patch"], op_name)
            or (DYNAMIC_M if dynamic_m(kernel_inputs) else None)
            or (PREPACK_OFF if packed and not inductor_config.cpp.weight_prepack else None)
            or (TRANSPOSED_INPUT if packed and strided_input(kernel_inputs) else None)
            or (isa_mismatch() if tuned_here else None))


def wants_cpp(entry: dict[str, Any]) -> bool:
    """A config entry whose backend list includes Inductor's C++ GEMM template."""
    if entry.get("template_id") != CONFIG_TEMPLATE_ID:
        return False
    return "CPP" in str((entry.get("config_patch") or {}).get("max_autotune_gemm_backends", "")).upper()
