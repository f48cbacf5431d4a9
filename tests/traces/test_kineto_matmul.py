"""Compute kernels told apart by name: GEMM/convolution/attention (at the FLOP/s roof) from the rest."""

from __future__ import annotations

import pytest

from server.analysis.traces.kineto import is_matmul_kernel, summarize_trace

MATMUL = ["volta_sgemm_128x64_nn", "ampere_sgemm_128x128_tn",
          "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>(cutlass_80_tensorop_s1688ge",
          "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", "volta_scudnn_128x64_relu_interior_nn_v1",
          "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5>", "flash_fwd_kernel<Flash_fwd_params>",
          "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<float>"]
OTHER = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
         "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float>>",
         "void split_embedding_codegen_forward_unweighted_kernel<float, float, float, long, 2ul>",
         "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda, convert>",
         "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>"]


@pytest.mark.parametrize("name", MATMUL)
def test_gemm_conv_attention_kernels_are_matmul(name: str) -> None:
    assert is_matmul_kernel(name)


@pytest.mark.parametrize("name", OTHER)
def test_elementwise_reduction_embedding_kernels_are_not(name: str) -> None:
    assert not is_matmul_kernel(name)


def test_real_traces_matmul_fraction(real_data) -> None:  # type: ignore[no-untyped-def]
    a100 = summarize_trace(real_data / "kineto/hta/trace_diff/control/control.json.gz")
    v100 = summarize_trace(real_data / "kineto/hta/trace_diff/test/test.json.gz")
    # an embedding-heavy recommender: most compute time is outside GEMMs; the V100 (no tensor-core TF32) spends a
    # larger share of it in its sgemm kernels than the A100 in its tensor-op ones
    assert a100.compute_matmul_fraction is not None and v100.compute_matmul_fraction is not None
    assert 0.1 < a100.compute_matmul_fraction < v100.compute_matmul_fraction < 0.6
