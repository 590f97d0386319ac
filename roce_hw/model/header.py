# SPDX-License-Identifier: BSD-2-Clause
"""Pure-Python references of :class:`roce_hw.lib.header.HeaderInserter` and
:class:`roce_hw.lib.header.HeaderExtractor`, built from ``proto.Header.pack``/``unpack`` only
(no Amaranth import).

``fields`` is a ``dict`` keyed by ``header.name.lower()`` (``"eth"``, ``"bth"``...) of ``dict``\\ s
of field values, the same keys as the hardware's ``fields`` layout.
"""

from .. import proto

__all__ = ["SHORT", "common_prefix", "header_bytes", "insert", "extract"]

#: What :func:`extract` returns for a frame shorter than its headers.
SHORT = "short"


def _key(header):
    return header.name.lower()


def _unpack(headers, frame):
    """The fields of ``headers`` decoded from the start of ``frame``, and the offset after
    them."""
    pos, fields = 0, {}
    for h in headers:
        fields[_key(h)] = h.unpack(frame, pos)
        pos += h.size
    return fields, pos


def header_bytes(variant):
    """Total header length ``H`` of a variant (sum of ``Header.size``)."""
    return sum(h.size for h in variant)


common_prefix = proto.common_prefix


def insert(variant, fields, payload=b""):
    """Frame bytes: ``header.pack(fields[key])`` for each header of ``variant`` (a tuple of
    :class:`proto.Header`), then ``payload``."""
    for header in variant:
        if not isinstance(header, proto.Header):
            raise TypeError(f"{header!r} is not a proto.Header")
    return b"".join(h.pack(fields.get(_key(h), {})) for h in variant) + bytes(payload)


def extract(variants, frame, classify=None):
    """Split ``frame`` into ``(variant index, fields, payload bytes)``, or :data:`SHORT`.

    ``classify(prefix_fields) -> int`` picks the variant from the decoded headers of the common
    prefix of ``variants`` (a ``dict`` like ``fields``); it may be ``None`` for one variant.
    ``fields`` holds the decoded headers of the chosen variant. A frame shorter than the common
    prefix or than the chosen variant's headers gives :data:`SHORT`."""
    variants = [tuple(v) for v in variants]
    frame = bytes(frame)
    if len(variants) == 1:
        index = 0
    else:
        if classify is None:
            raise ValueError("several variants need a classify function")
        prefix = common_prefix(variants)
        if len(frame) < header_bytes(prefix):
            return SHORT
        pfields, _ = _unpack(prefix, frame)
        index = int(classify(pfields))
        if not 0 <= index < len(variants):
            raise ValueError(f"classify returned {index}, not a variant index")
    variant = variants[index]
    if len(frame) < header_bytes(variant):
        return SHORT
    fields, pos = _unpack(variant, frame)
    return index, fields, frame[pos:]
