"""Byte format of xMK-CKKS objects: a fixed header and bit-packed residues.

Header (52 bytes, little-endian)::

    magic      4s   b"FXMK"
    version    u8   FORMAT_VERSION (1)
    kind       u8   1 secret key, 2 public key, 3 ciphertext,
                    4 decryption share, 5 polynomials (e.g. C1_sum)
    limbs      u16  L
    n          u32  ring degree
    count      u32  polynomials per component (k)
    params_id  32s  ParameterSet.name, ASCII, NUL-padded
    aux        u32  public key: shares aggregated; ciphertext: ciphertexts summed

Payload: for each component (c0 then c1 for a ciphertext) and each limb i,
the k*n residues of that limb packed little-endian at bit_length(q_i) bits
each (eight values per bit_length(q_i) bytes). A secret key's payload is n
signed bytes in {-1, 0, 1}.

Loading is strict: wrong magic, version, kind, parameter set, n, limbs,
count, payload length, or any residue >= q_i raises ``ValueError`` whose
message names the field.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from .params import ParameterSet, get_parameter_set

__all__ = [
    "FORMAT_VERSION",
    "KIND_SECRET_KEY",
    "KIND_PUBLIC_KEY",
    "KIND_CIPHERTEXT",
    "KIND_DECRYPTION_SHARE",
    "KIND_POLYNOMIALS",
    "HEADER_SIZE",
    "pack_header",
    "unpack_header",
    "pack_polys",
    "pack_rows_into",
    "unpack_polys",
    "unpack_rows",
    "packed_size",
]

MAGIC = b"FXMK"
FORMAT_VERSION = 1
KIND_SECRET_KEY = 1
KIND_PUBLIC_KEY = 2
KIND_CIPHERTEXT = 3
KIND_DECRYPTION_SHARE = 4
KIND_POLYNOMIALS = 5
_KIND_NAMES = {
    KIND_SECRET_KEY: "secret key",
    KIND_PUBLIC_KEY: "public key",
    KIND_CIPHERTEXT: "ciphertext",
    KIND_DECRYPTION_SHARE: "decryption share",
    KIND_POLYNOMIALS: "polynomials",
}
_HEADER = struct.Struct("<4sBBHII32sI")
HEADER_SIZE = _HEADER.size
_MAX_COUNT = 1 << 24


def pack_header(kind: int, params: ParameterSet, count: int, aux: int = 0) -> bytes:
    """The 52-byte header for an object of ``kind`` with ``count`` polynomials."""
    return _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        kind,
        params.limbs,
        params.n,
        count,
        params.name.encode("ascii"),
        aux,
    )


def unpack_header(
    data: bytes | bytearray | memoryview, kind: int, params: ParameterSet | None = None
) -> tuple[ParameterSet, int, int]:
    """Parse and validate a header.

    Parameters
    ----------
    data : bytes, bytearray or memoryview
        The serialized object (header first).
    kind : int
        Expected kind.
    params : ParameterSet, optional
        Expected parameter set; ``None`` looks the id up in
        :data:`~flwr_fedeval.rlwe.params.PARAMETER_SETS`.

    Returns
    -------
    (params, count, aux)

    Raises
    ------
    ValueError
        Naming the field: ``data`` (type/too short), ``magic``, ``version``,
        ``kind``, ``params_id``, ``n``, ``limbs`` or ``count``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"data must be bytes, got {type(data).__name__}")
    if len(data) < HEADER_SIZE:
        raise ValueError(f"data too short for the header: {len(data)} < {HEADER_SIZE} bytes")
    magic, version, got_kind, limbs, n, count, pid, aux = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"magic is {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise ValueError(f"version is {version}, expected {FORMAT_VERSION}")
    if got_kind != kind:
        raise ValueError(
            f"kind is {_KIND_NAMES.get(got_kind, got_kind)!r}, expected {_KIND_NAMES[kind]!r}"
        )
    try:
        name = pid.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("params_id is not ASCII") from None
    if params is None:
        params = get_parameter_set(name)
    elif name != params.name:
        raise ValueError(f"params_id is {name!r}, expected {params.name!r}")
    if n != params.n:
        raise ValueError(f"n is {n}, expected {params.n} for {params.name}")
    if limbs != params.limbs:
        raise ValueError(f"limbs is {limbs}, expected {params.limbs} for {params.name}")
    if not 1 <= count <= _MAX_COUNT:
        raise ValueError(f"count is {count}, expected 1..{_MAX_COUNT}")
    return params, count, aux


def _limb_bits(params: ParameterSet) -> list[int]:
    return [p.bit_length() for p in params.primes]


def packed_size(params: ParameterSet, count: int, components: int) -> int:
    """Payload bytes of ``components`` batches of ``count`` polynomials."""
    return components * sum(count * params.n * b // 8 for b in _limb_bits(params))


@functools.lru_cache(maxsize=64)
def _pair_terms(bits: int) -> tuple[tuple[tuple[int, int, bool], ...], ...]:
    """For each 64-bit word of a group of eight ``bits``-bit values (bits <= 32): the pairs (k, shift,
    left) that land in it, pair k = v_2k | v_2k+1 << bits sitting at bit 2·bits·k of the group."""
    nwords = (8 * bits + 63) // 64
    terms: list[list[tuple[int, int, bool]]] = [[] for _ in range(nwords)]
    for k in range(4):
        w, sh = divmod(2 * bits * k, 64)
        terms[w].append((k, sh, True))
        if sh + 2 * bits > 64:
            terms[w + 1].append((k, 64 - sh, False))
    return tuple(tuple(t) for t in terms)


def _pack_bits(values: np.ndarray, bits: int, out: np.ndarray | None = None) -> bytes:
    """Pack uint64 values (< 2^bits, count divisible by 8) at ``bits`` bits each, little-endian.

    Eight values fill ``bits`` bytes. With ``out`` (uint8, shape (count // 8, bits)) the packed bytes
    are written there and ``b""`` is returned (no intermediate ``bytes``).
    """
    v = values.reshape(-1, 8)
    groups = v.shape[0]
    nwords = (8 * bits + 63) // 64
    words = np.empty((groups, nwords), dtype=np.uint64)
    if bits <= 32:
        # two values per 64-bit pair first (2·bits <= 64), then four pairs per group: half the
        # column operations of placing the eight values one by one
        pairs = v[:, 1::2] << np.uint64(bits)
        pairs |= v[:, 0::2]
        for w, terms in enumerate(_pair_terms(bits)):
            dst = words[:, w]
            for j, (k, sh, left) in enumerate(terms):
                shift = np.left_shift if left else np.right_shift
                if j == 0:
                    shift(pairs[:, k], np.uint64(sh), out=dst)
                else:
                    dst |= shift(pairs[:, k], np.uint64(sh))
    else:
        words[...] = 0
        for j in range(8):
            w, sh = divmod(j * bits, 64)
            words[:, w] |= v[:, j] << np.uint64(sh)
            if sh + bits > 64:
                words[:, w + 1] |= v[:, j] >> np.uint64(64 - sh)
    raw = words.astype("<u8", copy=False).view(np.uint8).reshape(groups, nwords * 8)
    if out is not None:
        out[...] = raw[:, :bits]
        return b""
    return raw[:, :bits].tobytes()


def _unpack_bits(data: bytes | memoryview, bits: int, count: int, dtype: type = np.uint64) -> np.ndarray:
    """Inverse of :func:`_pack_bits`: ``count`` values (count divisible by 8) as ``dtype`` (uint64, or
    uint32 for bits <= 32), not checked against any modulus.

    Value j of a group starts at bit j·bits: it is read as the little-endian 64-bit word at byte
    ⌊j·bits/8⌋ (a strided view of the packed bytes, padded by eight bytes), shifted and masked.
    """
    groups = count // 8
    if bits > 56:  # a value may straddle nine bytes: word by word
        raw = np.frombuffer(data, dtype=np.uint8).reshape(groups, bits)
        nwords = (8 * bits + 63) // 64
        buf = np.zeros((groups, nwords * 8), dtype=np.uint8)
        buf[:, :bits] = raw
        words = buf.view("<u8").astype(np.uint64)
        out64 = np.empty((groups, 8), dtype=np.uint64)
        for j in range(8):
            w, sh = divmod(j * bits, 64)
            x = words[:, w] >> np.uint64(sh)
            if sh + bits > 64:
                x |= words[:, w + 1] << np.uint64(64 - sh)
            out64[:, j] = x & np.uint64((1 << bits) - 1)
        return out64.reshape(-1).astype(dtype, copy=False)
    padded = np.empty(groups * bits + 8, dtype=np.uint8)
    padded[: groups * bits] = np.frombuffer(data, dtype=np.uint8)
    padded[groups * bits :] = 0
    out: np.ndarray = np.empty((groups, 8), dtype=dtype)
    mask = np.uint64((1 << bits) - 1)
    tmp = np.empty(groups, dtype=np.uint64)
    for j in range(8):
        byte, sh = divmod(j * bits, 8)
        word = np.ndarray((groups,), dtype="<u8", buffer=padded, offset=byte, strides=(bits,))
        np.right_shift(word, np.uint64(sh), out=tmp)
        np.bitwise_and(tmp, mask, out=out[:, j], casting="unsafe")
    return out.reshape(-1)


def pack_polys(params: ParameterSet, arrays: list[np.ndarray]) -> bytes:
    """Payload for ring-element batches, each of shape (k, L, n) uint64."""
    parts = []
    for arr in arrays:
        for i, b in enumerate(_limb_bits(params)):
            parts.append(_pack_bits(np.ascontiguousarray(arr[:, i, :]).reshape(-1), b))
    return b"".join(parts)


def _limb_layout(params: ParameterSet, count: int) -> list[tuple[int, int, int]]:
    """(byte offset of the limb in one component's payload, bits per residue, q_l) for every limb."""
    out, pos = [], 0
    for b, p in zip(_limb_bits(params), params.primes):
        out.append((pos, b, p))
        pos += count * params.n * b // 8
    return out


def _check_rows(params: ParameterSet, count: int, start: int, stop: int) -> None:
    if params.n % 8:
        raise ValueError(f"n = {params.n} is not a multiple of 8: rows are not byte-aligned")
    if not 0 <= start < stop <= count:
        raise ValueError(f"rows [{start}, {stop}) are not within [0, {count})")


def unpack_rows(
    params: ParameterSet,
    payload: bytes | memoryview,
    count: int,
    start: int,
    stop: int,
    name: str,
) -> np.ndarray:
    """Polynomials ``start`` to ``stop`` of one component packed by :func:`pack_polys`, checked.

    Every limb's residues of polynomial r sit at bytes r·n·b_l/8 to (r+1)·n·b_l/8
    of that limb's block (b_l = bit_length(q_l), n a multiple of 8), so a range of
    polynomials is read without unpacking the rest: the server folds a ciphertext
    a few polynomials at a time (one reply in flight: memory flat in M).

    Parameters
    ----------
    params : ParameterSet
    payload : bytes or memoryview
        One component's payload (``packed_size(params, count, 1)`` bytes, no header).
    count : int
        Polynomials in the component (from the header).
    start, stop : int
        0 <= start < stop <= count.
    name : str
        Component name for the error message (e.g. ``"c0"``).

    Returns
    -------
    ndarray of shape (stop - start, L, n), uint64

    Raises
    ------
    ValueError
        ``payload length`` mismatch, rows out of range, or ``<name> limb i`` holding a value >= q_i
        (the same check and message as :func:`unpack_polys`).
    """
    expected = packed_size(params, count, 1)
    if len(payload) != expected:
        raise ValueError(f"payload length is {len(payload)} bytes, expected {expected} for count = {count}")
    _check_rows(params, count, start, stop)
    n = params.n
    view = memoryview(payload)
    arr = np.empty((stop - start, params.limbs, n), dtype=np.uint64)
    for i, (pos, b, p) in enumerate(_limb_layout(params, count)):
        lo, hi = pos + start * n * b // 8, pos + stop * n * b // 8
        vals = _unpack_bits(view[lo:hi], b, (stop - start) * n)
        if np.any(vals >= np.uint64(p)):
            raise ValueError(f"{name} limb {i} has values >= q_{i} = {p}")
        arr[:, i, :] = vals.reshape(stop - start, n)
    return arr


def pack_rows_into(
    params: ParameterSet, payload: bytearray | memoryview, count: int, start: int, rows: np.ndarray
) -> None:
    """Write polynomials ``start`` to ``start + len(rows)`` of one component into its payload buffer.

    The bytes written are those :func:`pack_polys` writes for them: packing a component in row
    ranges that cover it gives :func:`pack_polys`'s payload exactly.

    Parameters
    ----------
    params : ParameterSet
    payload : bytearray or writable memoryview
        One component's payload buffer (``packed_size(params, count, 1)`` bytes).
    count : int
        Polynomials in the component.
    start : int
        Index of the first row.
    rows : ndarray of shape (r, L, n), unsigned integers
        Reduced residues (< q_l; not checked here: pack what the ring produced).

    Raises
    ------
    ValueError
        Buffer length, shape or row range mismatch.
    """
    if len(payload) != packed_size(params, count, 1):
        raise ValueError(f"payload buffer is {len(payload)} bytes, expected {packed_size(params, count, 1)}")
    if rows.ndim != 3 or rows.shape[1:] != (params.limbs, params.n):
        raise ValueError(f"rows must have shape (r, {params.limbs}, {params.n}), got {rows.shape}")
    stop = start + rows.shape[0]
    _check_rows(params, count, start, stop)
    n = params.n
    view = memoryview(payload)
    for i, (pos, b, _) in enumerate(_limb_layout(params, count)):
        lo, hi = pos + start * n * b // 8, pos + stop * n * b // 8
        view[lo:hi] = _pack_bits(rows[:, i, :].astype(np.uint64).reshape(-1), b)


def unpack_polys(
    params: ParameterSet,
    data: bytes,
    count: int,
    names: tuple[str, ...],
) -> list[np.ndarray]:
    """Inverse of :func:`pack_polys` for the payload after the header.

    Parameters
    ----------
    params : ParameterSet
    data : bytes
        The whole serialized object (header included).
    count : int
        Polynomials per component (from the header).
    names : tuple of str
        Component names, used in error messages (e.g. ``("c0", "c1")``).

    Returns
    -------
    list of ndarray of shape (count, L, n), uint64

    Raises
    ------
    ValueError
        ``payload length`` mismatch, or ``<name> limb i`` holding a value >= q_i.
    """
    expected = packed_size(params, count, len(names))
    got = len(data) - HEADER_SIZE
    if got != expected:
        raise ValueError(
            f"payload length is {got} bytes, expected {expected} for count = {count}"
        )
    view = memoryview(data)[HEADER_SIZE:]
    size = packed_size(params, count, 1)
    return [
        unpack_rows(params, view[j * size : (j + 1) * size], count, 0, count, name)
        for j, name in enumerate(names)
    ]
