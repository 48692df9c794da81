"""``dir(pgqueue)`` and ``dir(pgqueue.testing)`` list the public names, and only them.

A user exploring the package (``dir()``, a REPL's tab completion) sees
``__all__``, ``__version__`` and the public submodules already imported,
never the private modules (``_worker``, ``_sql``...) nor ``annotations``
from ``from __future__ import annotations``.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from types import ModuleType

import pytest

import pgqueue
import pgqueue.sqlalchemy
import pgqueue.sync
import pgqueue.testing

PACKAGES = [pgqueue, pgqueue.testing, pgqueue.sync, pgqueue.sqlalchemy]


def fresh_dir(module: str) -> list[str]:
    """``dir(module)`` in a new interpreter, where nothing else was imported."""
    code = f"import json, {module}; print(json.dumps(dir({module})))"
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        check=True,
        text=True,
        timeout=60,
    )
    names: list[str] = json.loads(result.stdout)
    return names


def test_dir_of_pgqueue_is_all_and_the_version() -> None:
    assert fresh_dir("pgqueue") == sorted([*pgqueue.__all__, "__version__"])


@pytest.mark.parametrize(
    "package",
    [pgqueue.testing, pgqueue.sync, pgqueue.sqlalchemy],
    ids=lambda p: p.__name__,
)
def test_dir_of_an_extra_is_all(package: ModuleType) -> None:
    assert fresh_dir(package.__name__) == sorted(package.__all__)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_dir_adds_only_public_submodules_once_imported(package: ModuleType) -> None:
    # This run has imported more (pgqueue.testing.pytest_plugin, say).
    extra = set(dir(package)) - {*package.__all__, "__version__"}
    for name in extra:
        value = getattr(package, name)
        assert isinstance(value, ModuleType), name
        assert value.__name__ == f"{package.__name__}.{name}"
        assert not name.startswith("_"), name
    assert "annotations" not in dir(package)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_name_in_all_exists_once(package: ModuleType) -> None:
    names = package.__all__
    assert len(set(names)) == len(names)
    missing = [name for name in names if not hasattr(package, name)]
    assert missing == []
    assert set(names) <= set(dir(package))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_class_and_function_has_a_docstring_of_its_own(
    package: ModuleType,
) -> None:
    undocumented = []
    for name in package.__all__:
        value = getattr(package, name)
        if inspect.isclass(value):
            # A dataclass without one gets "Name(field: type, ...)".
            doc = value.__dict__.get("__doc__") or ""
            if doc.startswith(f"{name}("):
                doc = ""
        elif inspect.isfunction(value):
            doc = value.__doc__ or ""
        else:
            continue  # constants and type aliases
        if not doc.strip():
            undocumented.append(name)
    assert undocumented == []


def test_every_public_error_is_named_as_pgqueue_imports_it() -> None:
    errors = [
        obj
        for name in pgqueue.__all__
        if isinstance(obj := getattr(pgqueue, name), type)
        and issubclass(obj, BaseException)
    ]
    assert len(errors) == 14
    for error in errors:
        assert error.__module__ == "pgqueue", error
    # What a traceback shows.
    code = (
        "import pgqueue\n"
        "raise pgqueue.SchemaError('x', where='u@h:5432/d', apply='SCHEMA')\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    ).stderr
    assert shown.splitlines()[-1].startswith("pgqueue.SchemaError: u@h:5432/d: x: "), (
        shown
    )


@pytest.mark.parametrize(
    "package",
    [pgqueue.testing, pgqueue.sync, pgqueue.sqlalchemy],
    ids=lambda p: p.__name__,
)
def test_every_error_an_extra_exports_is_a_pgqueue_error(package: ModuleType) -> None:
    # pgqueue.django's are checked in tests/django_suite (Django needs 3.12).
    errors = [
        obj
        for name in package.__all__
        if isinstance(obj := getattr(package, name), type)
        and issubclass(obj, BaseException)
    ]
    assert all(issubclass(error, pgqueue.PgQueueError) for error in errors), errors


def test_server_unavailable_is_a_pgqueue_error_and_still_a_runtime_error() -> None:
    error = pgqueue.testing.ServerUnavailableError
    assert issubclass(error, pgqueue.PgQueueError)
    assert issubclass(error, RuntimeError)
