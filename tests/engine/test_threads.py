from llmserve.engine.threads import FEW_ROWS, engine_threads, step_threads


def test_an_instance_gets_its_share_of_the_cores():
    assert [engine_threads(c) for c in (1, 2, 3, 4, 8, 16)] == [1, 2, 3, 4, 8, 16]
    assert engine_threads(16, 4) == 4 and engine_threads(2, 4) == 1 and engine_threads(8, 3) == 2


def test_few_row_steps_leave_a_core_to_the_api_process():
    assert [step_threads(r, 2) for r in (1, FEW_ROWS, FEW_ROWS + 1, 512)] == [1, 1, 2, 2]
    assert step_threads(1, 16) == 15 and step_threads(64, 16) == 16
    assert step_threads(1, 1) == 1 and step_threads(64, 1) == 1  # never none
