"""What the tests share: helpers and servers, imported by the tests (never from conftest or
from another test module)."""
