from llmserve.engine.threads import engine_threads


def test_a_core_is_left_to_the_api_process_and_the_rest():
    assert [engine_threads(c) for c in (1, 2, 3, 4, 8, 16)] == [1, 1, 2, 3, 7, 15]
    assert engine_threads(16, 4) == 3 and engine_threads(2, 4) == 1 and engine_threads(8, 2) == 3
