"""The op namespace of the universal build (no compiled extension)."""

ops = None


def add_op_namespace_prefix(op_name: str) -> str:
    return f"_tiny_universal::{op_name}"
