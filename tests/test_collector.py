"""The cyclic garbage collector around a migrate run (migrate/collector.py)."""

import gc

from migrate import collector


def test_the_startup_pause_freezes_what_was_loaded_and_lets_the_collector_run_for_the_files():
    assert gc.isenabled()
    try:
        collector.pause_for_startup()
        assert not gc.isenabled()
        collector.startup_done()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_collector_the_caller_paused_stays_paused():
    gc.disable()
    try:
        collector.pause_for_startup()
        collector.startup_done()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()
