"""src_dask.interrupts: SIGINT held back while workers start, Dask's logs quiet after a
Ctrl-C and restored afterwards, and what an interrupt left freed."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from src_dask import interrupts


@pytest.fixture
def terminal_sigint():
    """SIGINT as a command typed at a terminal has it (Python's handler): a shell's
    background job, such as a test run started with ``&``, starts with it ignored, and
    then ``sigint_deferred`` rightly leaves it alone."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_deferred_records_a_sigint_and_restores_the_handler(terminal_sigint):
    if not hasattr(signal, "pthread_sigmask"):
        pytest.skip("no POSIX signal masks")
    handler = signal.getsignal(signal.SIGINT)
    with interrupts.sigint_deferred() as came:
        # to this thread: one sent to the process may go to a thread of an earlier test
        # that does not block it, and be handled after the block ends
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # blocked: kept
    assert came() is True
    assert signal.getsignal(signal.SIGINT) is handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with interrupts.sigint_deferred() as came:
        pass
    assert came() is False


def test_sigint_deferred_is_a_no_op_outside_the_main_thread():
    seen = []

    def body():
        with interrupts.sigint_deferred() as came:
            seen.append(came())

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [False]


def test_quiet_logs_silences_dasks_loggers_and_restores_them():
    logger = logging.getLogger("distributed.scheduler")
    mine = logging.getLogger("src_dask")
    logger.disabled = False
    with interrupts.quiet_logs():
        assert logger.disabled and logging.getLogger("tornado").disabled
        assert not mine.disabled  # only Dask's (and its libraries')
    assert not logger.disabled


def test_forget_frees_the_tracebacks_of_an_interrupt_and_its_context():
    def raise_chained():
        try:
            raise ValueError("first")
        except ValueError:
            raise KeyboardInterrupt from None

    with pytest.raises(KeyboardInterrupt) as info:
        raise_chained()
    err = info.value
    assert err.__traceback__ is not None and err.__context__.__traceback__ is not None
    interrupts.forget(err)
    assert err.__traceback__ is None and err.__context__.__traceback__ is None
    cycle = KeyboardInterrupt()
    cycle.__context__ = cycle  # a loop of contexts ends too
    interrupts.forget(cycle)

