"""Session set-up and the speed tiers.

rlxviz's CPU kernels are built (or loaded from the cache) once, before any test, so the first build (~30 s of CPU)
never lands inside a test with a time bound of its own (the fuzz watchdogs).

Speed tiers (issue 36): a test is `slow` when it drives a browser, executes notebooks, fuzzes, runs a benchmark or
spends its time in child processes (a served app, a CLI subprocess, an isolated loader). `make test-fast` runs
`pytest -m "not slow"` for every commit; `make test` (and CI) runs everything. `SLOW_PREFIXES` and `SLOW_FILES`
mark whole files, `SLOW_TESTS` single tests of otherwise fast files (the name before any `[param]`);
`@pytest.mark.slow` in a test file works too. A listed test its module does not define, or a listed file that does
not exist, fails the run, so a rename cannot quietly move a slow test into the fast tier.

`make test` runs the slow tests that only compute (`COMPUTE_FILES`, `COMPUTE_TESTS`, or `@pytest.mark.sweep` in a
test file: marked `slow` and `sweep`) with the fast tier on every core, and the rest of the slow tier one test at a
time. Only compute means: no timing it asserts on, no wall-clock limit it could miss on a loaded machine, no
browser or served app, no long-lived child process, no fixed port or path shared with another test. Browser files
that time nothing (`SHARED_BROWSER_FILES`) and such tests of other browser files (`SHARED_BROWSER_TESTS`) run
there too, each file on one worker.
"""

import os
from pathlib import Path

import pytest
from served import pool_fixture

server_pool = pool_fixture()  # the browser files' served apps, one per environment (`served.ServerPool`)

HERE = Path(__file__).parent

SLOW_FILES: dict[str, str] = {
    "test_browser_app.py": "browser (a served app driven by Playwright)",
    "test_browser_flows.py": "browser",
    "test_browser_nav.py": "browser",
    "test_browser_problems.py": "browser",
    "test_browser_security.py": "browser",
    "test_bench_processes.py": "a benchmark, one process per configuration",
    "test_bench_runtime.py": "a benchmark",
    "test_isolated.py": "child processes killed at their limits",
    "test_cpu_limit.py": "busy child processes stopped at their CPU-time limits",
    "test_server_stop.py": "served apps stopped, with their child processes",
    "test_timeproc_bounds.py": "timing jobs in child processes, one stopped at its limit",
    "test_app_overlay.py": "error and time overlays computed in child processes",
}
"""Test files whose every test is slow, with the reason."""

SLOW_PREFIXES: dict[str, str] = {
    "test_browser_": "browser (a served app driven by Playwright)",
    "test_fuzz": "fuzzing",
    "test_bench_": "a benchmark",
}
"""File name prefixes whose every file is slow (a new browser test is slow without an entry)."""

SLOW_TESTS: dict[str, str] = {
    # child processes: loads through the isolated loader (session.isolated), timing workers, CLI subprocesses
    "test_app_state.py::test_an_uploaded_npz_with_expected_outputs_times_and_is_dropped_with_the_model":
        "an upload loaded and timed in child processes",
    "test_app_state.py::test_timing_runs_in_a_worker_process": "timing in a worker process",
    "test_app_state.py::test_timing_says_the_precision_policy_and_runs_uploaded_inputs": "timing in a worker "
                                                                                          "process",
    "test_reliability_cases.py::test_notebook_timing_checks_the_time_workload_as_the_cli_does": "times a model",
    # a stress of rlxviz's thread pool: 4 spinning workers in child processes, each run bounded by a timeout
    "test_gemm.py::test_the_pool_gives_the_same_numbers_whether_its_waits_spin_or_block": "thread-pool stress",
}
"""`file::test` (parameters dropped) of single slow tests in otherwise fast files, with the reason."""

COMPUTE_FILES: dict[str, str] = {
    "test_notebooks.py": "executes every notebook with nbclient (one kernel per notebook, a cell may take 240 s, the "
                         "slowest takes ~8 s; the timing cells' verdicts are checked against their own printed "
                         "numbers, busy machine included)",
    "test_fuzz.py": "fuzzing: thousands of mutated inputs in-process (5 s watchdog per input, each takes ~1 ms)",
    "test_fuzz_onnx.py": "fuzzing the ONNX importer (10 s watchdog per file, each takes ~0.1 s; the importer's "
                         "short forked checks are bounded in CPU time)",
}
"""Slow test files that only compute, with the reason: marked `slow` and `sweep` (on every core in `make test`)."""

COMPUTE_TESTS: dict[str, str] = {
    # heavy compute: real-size models through every pass or version, big diffs
    "test_passes.py::test_every_pass_and_the_pipeline_keep_numbers": "every pass on minilm-sized models, numbers "
                                                                     "checked on the reference",
    "test_runtime_versions.py::test_real_minilm_every_version_on_mlx_matches_transformers_fixture":
        "every version of the real MiniLM on MLX",
    "test_app_irdiff.py::test_big_graphs_diff_with_a_bounded_table": "diffs of big graphs",
    # the CLI, the notebooks' and the app's code on small models, CLI subprocesses and child-process loads:
    # verdicts and messages compared, nothing timed against a limit in reach (moved from the serial tier,
    # which set CI's length)
    "test_app_state.py::test_upload_good_and_corrupted": "uploads loaded in child processes",
    "test_app_state.py::test_an_uploaded_onnx_file_is_named_after_the_users_file": "an upload loaded in a child",
    "test_app_state.py::test_checkpoint_folder_only_under_allowed_dirs": "checkpoint loads in child processes",
    "test_session_parity.py::test_same_answers_from_the_cli_the_notebooks_and_the_app": "the CLI, the notebooks "
                                                                                       "and the app on one model",
    "test_cli_run.py::test_subprocess_minilm_matches_fixture": "the CLI in a subprocess on the real model",
    "test_cli_run.py::test_bad_inputs_subprocess": "the CLI in a subprocess, per bad input",
    "test_cli_debug.py::test_subprocess_errors_have_no_traceback": "the CLI in subprocesses",
    "test_cli_render_time.py::test_ir_pipe_closed_early_is_not_an_error": "a shell pipeline of the CLI",
    "test_warnings_quiet.py::test_no_raw_warning_reaches_the_terminal_on_hostile_files": "the CLI in a "
                                                                                        "subprocess per file",
    # uploads and paths loaded in a short child process each, bounded in CPU time (the isolated loader: 120 s, a
    # wall-clock backstop of 10x that; each load takes a few seconds), nothing timed, files under tmp_path
    "test_verdict_parity.py::test_an_uploaded_onnx_file_every_view_one_verdict": "ONNX uploads, each loaded in a "
                                                                                  "child process, through every view",
    "test_app_start.py::test_a_dropped_onnx_file_loads_and_half_a_checkpoint_waits": "uploads in child processes",
    "test_app_views.py::test_why_tab_opens_on_a_layer_after_an_upload": "an upload loaded in a child process",
    "test_app_views.py::test_variants_disabled_for_an_uploaded_onnx_export": "an upload loaded in a child process",
    "test_onnx_import.py::test_app_loads_an_onnx_path_only_under_the_allowed_dirs": "loads in child processes",
    "test_onnx_import.py::test_app_loads_an_onnx_upload": "an upload loaded in a child process",
    "test_app_source_switch.py::test_every_ordered_pair_of_sources_says_the_switch": "six ONNX loads in child "
                                                                                     "processes",
    "test_app_io_faults.py::test_the_newcomers_roberta_inputs_set_batch_2_and_sequence_8": "an upload loaded twice",
    "test_app_io_faults.py::test_an_upload_or_a_path_replacing_another_names_the_new_model": "four ONNX loads",
    "test_app_io_faults.py::test_the_newcomers_roberta_path_then_show_minilm_says_the_kept_shape": "an ONNX path "
                                                                                                   "loaded twice",
}
"""`file::test` (parameters dropped) of single slow tests that only compute, marked `slow` and `sweep`."""

SHARED_BROWSER_FILES: dict[str, str] = {
    name: "a browser on a served app of its own (a free port, its own log and screenshots); times nothing, every "
          "wait bounded at served.WAIT_MS (60 s), far above what a loaded 2-core runner takes"
    for name in ("test_browser_big_onnx.py", "test_browser_flows.py", "test_browser_matches_table.py",
                 "test_browser_nav.py", "test_browser_newcomer.py", "test_browser_number_boxes.py",
                 "test_browser_room.py", "test_browser_security.py", "test_browser_start_text.py",
                 "test_browser_drawing_title.py", "test_browser_zoom_search.py", "test_browser_big_layer_search.py",
                 "test_browser_search_visible.py", "test_browser_search_fit.py", "test_browser_onnx_name_search.py",
                 "test_browser_linked_search.py")
}
"""Browser test files that may share the cores (marked `slow` and `sweep`): no Timing run, no time limit asserted
but a bound many times the measured time (`test_browser_big_onnx.FIRST_PICTURE_S`). `make test` runs each file
on one worker (its module fixtures, the server and the browser, start once) beside the fast tier; it took 206 s
one test at a time and 145 s two files at a time (2-core Xeon, 2026-12-06). A browser file that times goes
nowhere here: it stays in the serial run. So does test_browser_zoom_search.py, which times nothing: in the shared
run two of its tests failed in 3 of 4 full runs on 2026-12-06 (a model switch or a path load after ② left the panes
centred at 0.9 zoom, the same transforms each time), never alone, as a file, or beside two CPU burners. Found
(2026-12-07, beside two burners: the path load in 2 of 7 runs, two more tests once each): the tests read the panes
before the new model's pictures arrived (the version list and the message come first), so ②'s or MiniLM's views
were read, or a `%id` typed was cleared by the late scope; they now wait for the new pictures.

Moved from the serial run on 2026-12-07 (it set CI's length, ~21 of 20 minutes): zoom_search, big_layer_search,
search_visible, search_fit, onnx_name_search and linked_search (~160 s one test at a time). Their fixed sleeps before
a read became waits for the state read: `served.settled` (each pane's box, transform, picture and map unchanged for
1 s), the hit's layer drawn after an Enter that kept the counter at 1/N (search_fit), the collapsed picture before a
node of it is clicked (search_visible: a click on the full picture just before it went opened no drawer, once).
Checked as the shared tier runs them, the six files alone, `-n 2 --dist loadgroup`, beside two CPU burners (AMD EPYC
2-core, load average ~14 from other sessions): 3 runs before that click's wait (pass 170 s, 1 fail 231 s, pass
265 s), then 3 passing runs (256 s, 277 s, 276 s). test_browser_newcomer_why.py (it presses the Timing button) and
test_browser_newcomer_nav.py (it opens the Timing tab, `test_shared_browser_tier.TIMES`) stay in the serial run.

Since 2026-12-07 these files share one served app per worker (`served.shared_server_fixture`, `served.ServerPool`:
the zoo's and the cases' folders allowed), not one each: the fifteen files, `-n 2 --dist loadgroup`, took 265 s
against 306 s with a server per file (2-core AMD EPYC, a newcomer run's app and browser also running)."""

SHARED_BROWSER_TESTS: dict[str, tuple[str, ...]] = {
    "test_browser_app.py": (
        "test_default_page_shows_minilm", "test_step_to_fused_layers", "test_extra_user_variant_shows_guard",
        "test_corrupted_upload_shows_error", "test_ir_text_draws_its_own_graph",
        "test_text_to_tokenize_shows_the_whole_sentence", "test_debugger_flow_keeps_the_view_and_finds_nodes",
        "test_teacher_flow_every_variant_and_pipeline", "test_ir_paste_small_and_large_and_a_parse_error",
        "test_version_slider_follows_the_model", "test_node_search_matches_the_node_itself",
        "test_layout_gives_the_graph_the_room"),
    "test_browser_problems.py": (
        "test_1_the_graph_gets_the_room_at_1280x800", "test_2_the_why_tab_answers_for_a_graph_without_layer_paths",
        "test_3_panes_are_not_left_faded_after_a_load_error", "test_5_search_finds_nodes_inside_folded_layers",
        "test_6_the_pass_filter_keeps_passes_with_rejections_and_chips_count_them",
        "test_8_variants_layers_zoom_and_start", "test_trial_1_the_start_strip_keeps_its_text_with_the_sidebar_open",
        "test_trial_2_the_start_strip_follows_the_model",
        "test_trial_3_4_uploads_are_emptied_and_errors_name_the_users_file",
        "test_trial_5_every_drop_on_the_start_strip_loads",
        "test_trial_8_9_the_overlay_colours_both_panes_and_its_legend_fits"),
    "test_browser_timing.py": ("test_search_enter_opens_the_folded_layer_and_centres_on_the_node",),
}
"""Single tests of browser files that also time (their Timing tests stay in the serial run): tests that press no
Timing button and assert no time bound, shared as `SHARED_BROWSER_FILES` are (the file's server starts once in each
run)."""

ONE_WORKER_FILES: dict[str, str] = {
    "test_notebooks.py": "its tests share one execution of each notebook (a module fixture): one worker runs them all",
    **{name: "its tests share one served app and one browser (module fixtures)"
       for name in (*SHARED_BROWSER_FILES, *SHARED_BROWSER_TESTS)},
}
"""Files whose tests `make test` (`-n auto --dist loadgroup`) sends to one worker as one unit, so a module fixture
runs once (`pytest_xdist_make_scheduler`); the tests of other files are shared out one by one."""


FIXTURE_SWEEPS: dict[str, str] = {
    "test_exact_claims.py::test_no_exact_claim_on_a_differing_version_in_the_fixtures": "default load",
    "test_fix_whatif.py::test_every_printed_fix_is_a_checked_what_if": "load at seq 8",
    "test_verdict_parity.py::test_every_onnx_fixture_and_zoo_file_every_form_one_verdict": "explain's default load",
    **{f"test_onnx_zoo.py::{t}": "the file's module cache (`_load`)" for t in (
        "test_every_zoo_version_gives_pytorchs_numbers_on_the_reference_mlx_and_onnx_runtime",
        "test_attention_packs_where_the_scores_are_plain_and_explain_names_the_block_elsewhere",
        "test_the_closed_gaps_pack_every_attention_with_their_canonicalizations",
        "test_an_additive_score_term_that_packs_is_named_by_its_kind",
        "test_swins_window_padding_is_an_ir_pad_that_runs_on_mlx",
        "test_albert_s_one_layer_module_called_twice_is_two_layers_that_each_fuse")},
    **{f"test_onnx_origin_remade.py::{t}": "the file's module cache (`_run`)" for t in (
        "test_the_merged_matmul_names_the_shared_gate_up_gemms_and_swiglu_does_not",
        "test_every_onnx_node_the_search_finds_in_a_node_its_inspector_lists")},
}
"""`file::test` of the tests parametrized by one ONNX fixture (id: the file's name or stem) that load it, with what
they load. Under `--dist loadgroup` the tests of one fixture are one unit (`work_unit`), run one after another on one
worker, so the process's caches (`session.MODELS`, `clirun.file_inputs`, a file's own) load each fixture about once
there, not once per test on whichever worker; shared out one test at a time, a zoo file was imported ~5 times."""


def work_unit(nodeid: str) -> str | None:
    """The unit `make test`'s scheduler keeps on one worker for the test `nodeid` (`tests/FILE::TEST[ID]`): the
    file, for `ONE_WORKER_FILES`; `fixture:STEM` for a `FIXTURE_SWEEPS` test of fixture STEM (the id less `.onnx`);
    None for a test shared out alone."""
    path, _, test = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    if file in ONE_WORKER_FILES:
        return file
    name, _, param = test.partition("[")
    if param and f"{file}::{name}" in FIXTURE_SWEEPS:
        return "fixture:" + param[:-1].removesuffix(".onnx")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [f for f in (*SLOW_FILES, *COMPUTE_FILES, *SHARED_BROWSER_FILES, *ONE_WORKER_FILES)
               if not (HERE / f).is_file()]
    if missing:
        raise pytest.UsageError(f"conftest lists test files that do not exist (renamed?): {missing}")
    modules = {}
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if item.path.name in SLOW_FILES or name in SLOW_TESTS or item.path.name.startswith(tuple(SLOW_PREFIXES)):
            item.add_marker(pytest.mark.slow)
        shared = item.path.name in SHARED_BROWSER_FILES or name.split("::")[1] in SHARED_BROWSER_TESTS.get(
            item.path.name, ())
        if item.path.name in COMPUTE_FILES or shared or name in COMPUTE_TESTS or item.get_closest_marker("sweep"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.sweep)
        if getattr(item, "module", None) is not None:
            modules[item.path.name] = item.module
    shared = {f"{f}::{t}": "" for f, tests in SHARED_BROWSER_TESTS.items() for t in tests}
    for table, listed in (("SLOW_TESTS", SLOW_TESTS), ("COMPUTE_TESTS", COMPUTE_TESTS),
                          ("SHARED_BROWSER_TESTS", shared), ("FIXTURE_SWEEPS", FIXTURE_SWEEPS)):
        stale = [n for n in listed if n.split("::")[0] in modules and not hasattr(modules[n.split("::")[0]],
                                                                                   n.split("::")[1])]
        if stale:
            raise pytest.UsageError(f"conftest.{table} names tests that do not exist (renamed?): {stale}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadgroup`: xdist's scheduler, with every test of a `ONE_WORKER_FILES` file in one unit, and the
    `FIXTURE_SWEEPS` tests of one fixture in one (`work_unit`; an `xdist_group` mark cannot do it under pytest 9:
    xdist 3.8 renames the item's old `_nodeid`, which pytest 9 no longer reads). Any other `--dist`: xdist's own."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneWorkerFiles(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            unit = work_unit(nodeid)
            return unit if unit is not None else super()._split_scope(nodeid)

    return OneWorkerFiles(config, log)


@pytest.fixture(scope="session", autouse=True)
def _cpu_kernels_built():
    from rlxviz import kernels
    from rlxviz.kernels.build import LOCK_WAIT_ENV

    os.environ.setdefault(LOCK_WAIT_ENV, "900")  # another session's build (~1 min, longer on a loaded machine)
    kernels.status()
