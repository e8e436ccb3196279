"""User errors (secureffm/errors.py): one base class, so a caller catches them all at once.

Truths used: the class tree stated in the module and each class's docstring.
"""

from __future__ import annotations

import pytest

import secureffm.errors as errors
from secureffm.errors import SecureFFMError


@pytest.mark.parametrize("name", [n for n in errors.__all__ if n != "SecureFFMError"])
def test_every_user_error_is_a_secureffm_error(name):
    cls = getattr(errors, name)
    assert issubclass(cls, SecureFFMError) and cls.__doc__


def test_the_base_is_an_exception_that_carries_its_message():
    assert issubclass(SecureFFMError, Exception)
    with pytest.raises(SecureFFMError, match="change x"):
        raise errors.ConfigError("change x")
    exported = {n for n in dir(errors) if isinstance(getattr(errors, n), type)
                and issubclass(getattr(errors, n), Exception)}
    assert exported == set(errors.__all__)  # every error class is exported
