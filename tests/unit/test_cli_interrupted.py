"""A command interrupted (Ctrl-C, SIGTERM) inside a library whose clean-up
then fails: said as the interruption, exit 130, not as that failure."""

import pytest
import typer

from hypermedia.cli.common import user_errors


def _commit_cut_short() -> None:
    """What SQLAlchemy does when KeyboardInterrupt lands mid-commit: the
    rollback of the half-finished transaction trips an ``assert``."""
    try:
        raise KeyboardInterrupt
    finally:
        raise AssertionError  # the library's clean-up, failing


def test_a_failure_while_interrupted_is_the_interruption() -> None:
    with pytest.raises(KeyboardInterrupt), user_errors():
        _commit_cut_short()


def test_a_failure_two_links_from_the_interrupt_too() -> None:
    with pytest.raises(KeyboardInterrupt), user_errors():
        try:
            _commit_cut_short()
        except AssertionError:
            raise RuntimeError("and its caller's handler failed as well") from None


def test_a_failure_of_its_own_is_still_exit_1() -> None:
    with pytest.raises(typer.Exit) as got, user_errors():
        raise AssertionError
    assert got.value.exit_code == 1


def test_a_failure_in_a_looping_chain_is_said_not_looped_over() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    with pytest.raises(typer.Exit) as got, user_errors():
        raise first
    assert got.value.exit_code == 1
