"""Test configuration: float64 so numerical oracles are tight, and (the
Equinox habit) rank promotion that raises, so silent broadcasting bugs
surface, and cheap XLA compilation (below). Dtype promotion stays 'standard': under 'strict', JAX's own
derivative rules (the oracle) fail, e.g. the jvp of lax.pow with an integer
exponent."""

import os

# XLA's cheapest CPU compilation for the test programs (tests/xla_options.py:
# the options this jaxlib knows). It cuts the suite's compile time by about a
# third on jax 0.10. Set before JAX creates its backend; a user's XLA_FLAGS wins.
if "XLA_FLAGS" not in os.environ:
    import xla_options

    os.environ["XLA_FLAGS"] = xla_options.env_flags()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


# --------------------------------------------------------------------------
# The quick subset: `python -m pytest -m "not slow"` (the `slow` marker is
# registered in pyproject.toml). Slow tests are marked in their own files
# (`@pytest.mark.slow`, or a module's `pytestmark`), except in the files below,
# which other people own: their slow tests are listed here by node id prefix
# (a test function's name covers all of its parameters). "Slow": a case of
# 0.5 s or more in `pytest --durations=0` on the shared 2-core machine.

import pathlib  # noqa: E402

import pytest  # noqa: E402

SLOW_ELSEWHERE = (
    # tests/test_per_sample.py (issue 19)
    "tests/test_per_sample.py::test_chunks_jit_and_keyword_arguments",
    "tests/test_per_sample.py::test_composes_with_vmap_over_models_and_grad",
    "tests/test_per_sample.py::test_convolution_kernels_through_patches",
    "tests/test_per_sample.py::test_equinox_models",
    "tests/test_per_sample.py::test_gathered_tables",
    "tests/test_per_sample.py::test_jacobians_auto_chunk_equal_unchunked",
    "tests/test_per_sample.py::test_low_precision_norms_accumulate_in_float32",
    "tests/test_per_sample.py::test_mean_reduction_noise_and_key",
    "tests/test_per_sample.py::test_per_sample_auto_chunk_measures_within_the_budget_under_jit",
    "tests/test_per_sample.py::test_random_programs_with_shared_weights",
    "tests/test_per_sample.py::test_shared_kernel_and_conv_in_a_program",
    "tests/test_per_sample.py::test_shared_weight_norm_includes_cross_terms",
    "tests/test_per_sample.py::test_vmap_auto_chunk_keeps_the_compiled_peak_within_the_budget",
    "tests/test_per_sample.py::test_argnums_tuple_and_in_dims",
    "tests/test_per_sample.py::test_conv_and_embedding_norms_do_not_materialise_per_example_gradients",
    "tests/test_per_sample.py::test_memory_report_is_close_to_xla_for_a_gradient_step",
    # the eager engine's tests
    "tests/test_deferred.py::test_a_queue_keeps_only_live_values",
    "tests/test_deferred.py::test_outputs_and_aux_of_transforms_are_arrays_never_placeholders",
    "tests/test_deferred.py::test_queued_steps_equal_jax_and_run_as_one_program",
    "tests/test_deferred.py::test_a_callback_runs_where_the_program_reaches_it",
    "tests/test_deferred.py::test_python_control_flow_on_a_queued_value_gets_its_value",
    "tests/test_eager_caches.py::test_calls_do_not_wait_for_compilation_and_agree_bit_for_bit",
    "tests/test_eager_caches.py::test_clear_caches_then_results_unchanged",
    "tests/test_eager_caches.py::test_repeated_grads_equal_jax_before_and_after_the_caches_engage",
    "tests/test_eager_caches.py::test_a_graph_in_a_key_is_held_weakly",
    "tests/test_eager_caches.py::test_a_lifted_function_dropped_by_the_user_is_freed",
    "tests/test_eager_caches.py::test_a_new_batch_size_compiles_a_few_programs_not_one_per_step",
    "tests/test_eager_caches.py::test_cached_backward_with_new_values_and_vjp_cotangents",
    "tests/test_eager_caches.py::test_caches_are_bounded_and_count_keys_seen_once_in_an_lru",
    "tests/test_eager_caches.py::test_nested_transforms_and_jax_jit_around_cached_steps_equal_jax",
    "tests/test_eager_caches.py::test_repeated_vmaps_equal_jax_before_and_after_batched_steps_engage",
    "tests/test_eager_caches.py::test_a_staged_backward_pass_is_batched_off_the_calling_thread",
    "tests/test_eager_caches.py::test_a_jitted_jax_function_through_functx_numpy_is_one_call_eagerly",
    "tests/test_staged_backward.py::test_staged_transpose_equals_jax_and_the_per_equation_path",
    "tests/test_staged_backward.py::test_staged_transpose_holds_no_value_of_a_call",
)

_TESTS = pathlib.Path(__file__).parent


class HeldCompiles:
    """Stands in for functx's compile thread: compilations wait until
    `release()` runs them (in the thread's order: priority, then
    submission)."""

    def __init__(self):
        self.jobs = []

    def submit(self, fn, priority):
        from concurrent.futures import Future

        future = Future()
        self.jobs.append((priority, len(self.jobs), fn, future))
        return future

    def release(self):
        for _, _, fn, future in sorted(self.jobs, key=lambda job: job[:2]):
            future.set_result(fn())
        self.jobs.clear()


@pytest.fixture
def held_compiles(monkeypatch):
    """The compile thread held: builds submitted during the test wait for
    `held_compiles.release()`."""
    from functx import caches

    caches.wait_for_compiles()
    held = HeldCompiles()
    monkeypatch.setattr(caches, "_executor", held)
    return held


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselect: this sees every collected test
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SLOW_ELSEWHERE):
            item.add_marker(pytest.mark.slow)
    _check_every_module_has_fast_tests(items)


def _check_every_module_has_fast_tests(items):
    """When the whole suite is collected, fail if a test module would be
    missing from the quick subset (all of its tests marked slow)."""
    modules = {}
    for item in items:
        path = item.path
        modules.setdefault(path, []).append(item.get_closest_marker("slow") is None)
    if set(modules) != set(_TESTS.glob("test_*.py")):
        return  # a selection of files: nothing to compare with
    only_slow = sorted(p.name for p, fast in modules.items() if not any(fast))
    if only_slow:
        raise pytest.UsageError(
            "these test modules have no test outside the `slow` marker, so "
            f"`pytest -m 'not slow'` would skip them entirely: {', '.join(only_slow)}. "
            "Leave at least one quick test of each module unmarked.")
