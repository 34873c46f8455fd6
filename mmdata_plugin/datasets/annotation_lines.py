"""Parsing of ``relative/path label`` annotation lines.

Shared by every dataset that reads such lists, so that all of them agree on
what a valid line is: the label is the last whitespace-separated field (any
number of digits), everything before it is the path (spaces allowed), blank
lines are not samples, and a last line without a newline is still a sample.
"""
from typing import Iterator, Tuple


class AnnotationFormatError(ValueError):
    """An annotation file has a line we cannot parse."""


def decode_line(raw: bytes, filename: str, lineno: int) -> str:
    """Decode one annotation line as UTF-8, naming the line on failure."""
    try:
        return raw.decode('utf-8')
    except UnicodeDecodeError as error:
        raise AnnotationFormatError(
            f'{filename}:{lineno}: line is not valid UTF-8 '
            f'({error.reason} at byte {error.start}): {raw[:80]!r}') from None


def parse_path_label(line: str, filename: str,
                     lineno: int) -> Tuple[str, int]:
    """Split ``relative/path label`` into its path and integer label.

    Args:
        line (str): One line, with or without its line terminator.
        filename (str): The annotation file, for error messages.
        lineno (int): 1-based line number, for error messages.

    Returns:
        tuple[str, int]: The relative path and the label.
    """
    fields = line.rstrip().rsplit(maxsplit=1)
    if len(fields) != 2 or not fields[1].isdigit() or not fields[1].isascii():
        raise AnnotationFormatError(
            f'{filename}:{lineno}: expected "relative/path label" with an '
            f'integer label, got {line.rstrip()!r}')
    return fields[0], int(fields[1])


def iter_path_labels(filename: str) -> Iterator[Tuple[int, str, int]]:
    """Yield ``(lineno, path, label)`` for every sample line of a file."""
    with open(filename, 'rb') as file:
        for lineno, raw in enumerate(file, 1):
            line = decode_line(raw, filename, lineno)
            if line.strip():
                path, label = parse_path_label(line, filename, lineno)
                yield lineno, path, label
