"""The UF2 writer and checker (tools/deploykit/readers/uf2.py), block by block against the format.

The ELFs here are built byte by byte (program headers only), so every layout the writer must
handle is explicit: a flash image with an IMAGE_DEF, .data whose load address differs from its
run address, RAM-only segments, sector gaps. The expected numbers are the UF2 specification's
and the RP2 boot ROMs' (written out here, not taken from the module under test). When picotool
is available (on PATH, or built by deploykit in the workspace), the writer must match it byte
for byte.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deploykit.readers import uf2
from deploykit.readers.uf2 import Uf2Error, check_uf2, elf_to_uf2

# The UF2 specification (github.com/microsoft/uf2) and pico-sdk's boot/uf2.h.
MAGIC0, MAGIC1, MAGIC_END = 0x0A324655, 0x9E5D5157, 0x0AB16F30
FAMILY_PRESENT, EXTENSIONS_PRESENT = 0x00002000, 0x00008000
RP2350_ARM_S, ABSOLUTE = 0xE48BFF59, 0xE48BFF57
RP2_IGNORE_BLOCK_TAG = bytes.fromhex("04e35799")  # 0x9957e304 little-endian
E10_BLOCK_ADDRESS = 0x10FFFF00

TEXT = 0x10000000
DATA_VMA, DATA_LMA = 0x20000100, 0x10001240
FLASH_END_BLOCK = 0x10003000


def image_def_block() -> bytes:
    """An RP2350 IMAGE_DEF: start marker, IMAGE_TYPE item (EXE | S | ARM | RP2350), LAST item
    (1 word of items before it), link 0, end marker, as the SDK's crt0 lays it out."""
    image_type = 0x1 | (0x2 << 4) | (0x0 << 8) | (0x1 << 12)
    return (struct.pack("<I", 0xFFFFDED3) + bytes([0x42, 0x01]) + struct.pack("<H", image_type)
            + bytes([0xFF]) + struct.pack("<H", 1) + b"\0" + struct.pack("<I", 0)
            + struct.pack("<I", 0xAB123579))


def make_elf(segments, entry: int = TEXT | 1, machine: int = 40) -> bytes:
    """An ELF32 little-endian executable with the given PT_LOAD segments:
    (paddr, vaddr, data, memsz) each."""
    phnum = len(segments)
    offset = 52 + 32 * phnum
    phdrs, blobs = b"", b""
    for paddr, vaddr, data, memsz in segments:
        phdrs += struct.pack("<8I", 1, offset + len(blobs), vaddr, paddr, len(data), memsz, 7, 4)
        blobs += data
    ident = b"\x7fELF" + bytes([1, 1, 1, 0]) + b"\0" * 8
    header = ident + struct.pack("<HHIIIIIHHHHHH", 2, machine, 1, entry, 52, 0, 0x05000200, 52,
                                 32, phnum, 40, 0, 0)
    return header + phdrs + blobs


def firmware_like_segments():
    text = bytearray(bytes(range(256)) * 18 + bytes(0x34))  # 0x1234 bytes
    text[0x138:0x138 + len(image_def_block())] = image_def_block()
    data = bytes(range(0x30, 0x60))  # .data: runs in RAM, loaded from flash
    return [
        (TEXT, TEXT, bytes(text), len(text)),
        (DATA_LMA, DATA_VMA, data, 0x80),  # 0x50 bytes of zero-initialised tail
        (0x20000200, 0x20000200, b"", 0x1000),  # .bss / pools: RAM only
        (FLASH_END_BLOCK, FLASH_END_BLOCK, b"\xaa" * 0x10, 0x10),  # a separate sector
    ]


@pytest.fixture
def elf(tmp_path) -> Path:
    p = tmp_path / "fw.elf"
    p.write_bytes(make_elf(firmware_like_segments()))
    return p


def blocks(data: bytes):
    assert len(data) % 512 == 0
    return [data[i:i + 512] for i in range(0, len(data), 512)]


def header(block: bytes):
    return struct.unpack_from("<8I", block, 0)


# ---- the writer --------------------------------------------------------------------------------

def test_every_block_follows_the_uf2_format(elf):
    data = elf_to_uf2(elf, "rp2350-arm-s")
    bs = blocks(data)
    main = bs[1:]
    for i, b in enumerate(main):
        m0, m1, flags, target, size, no, num, family = header(b)
        assert b[:4] == b"UF2\n" and (m0, m1) == (MAGIC0, MAGIC1)
        assert struct.unpack_from("<I", b, 508)[0] == MAGIC_END
        assert flags == FAMILY_PRESENT
        assert size == 256 and target % 256 == 0
        assert (no, num) == (i, len(main))
        assert family == RP2350_ARM_S
        assert b[32 + 256:508] == bytes(476 - 256)  # nothing after the payload
    targets = [header(b)[3] for b in main]
    assert targets == sorted(targets) and len(set(targets)) == len(targets)


def test_the_first_block_is_the_rp2350_e10_absolute_block(elf):
    first = blocks(elf_to_uf2(elf, "rp2350-arm-s"))[0]
    m0, m1, flags, target, size, no, num, family = header(first)
    assert flags == FAMILY_PRESENT | EXTENSIONS_PRESENT
    assert (target, size, no, num, family) == (E10_BLOCK_ADDRESS, 256, 0, 2, ABSOLUTE)
    assert first[32:32 + 256] == b"\xef" * 256
    assert first[32 + 256:32 + 260] == RP2_IGNORE_BLOCK_TAG
    assert first[32 + 260:508] == bytes(476 - 260)
    # RP2040 images get no E10 block.
    assert header(blocks(elf_to_uf2(elf, "rp2040"))[0])[7] == 0xE48BFF56


def test_payload_is_the_load_image_at_physical_addresses(elf):
    pages = {header(b)[3]: b[32:32 + 256] for b in blocks(elf_to_uf2(elf))[1:]}
    flat = b"".join(pages[a] for a in sorted(pages) if a < FLASH_END_BLOCK)
    segs = firmware_like_segments()
    assert flat[:0x1234] == segs[0][2]
    # .data is placed at its load address in flash, not at its RAM address.
    assert flat[DATA_LMA - TEXT:DATA_LMA - TEXT + 0x30] == segs[1][2]
    assert all(a < 0x20000000 for a in pages)  # nothing for RAM
    assert pages[FLASH_END_BLOCK][:16] == b"\xaa" * 16
    assert pages[FLASH_END_BLOCK][16:] == bytes(240)


def test_sectors_are_padded_like_picotool(elf):
    addrs = [header(b)[3] for b in blocks(elf_to_uf2(elf))[1:]]
    # Sectors 0 and 1 are touched and lie below the last page: all 16 pages of each. Sector 2
    # is untouched: absent. The last sector is not padded after its last page.
    assert addrs == [TEXT + 256 * i for i in range(32)] + [FLASH_END_BLOCK]


def test_zero_filled_page_parts_and_exact_size(tmp_path):
    p = tmp_path / "small.elf"
    p.write_bytes(make_elf([(TEXT + 0x10, TEXT + 0x10, b"\x11" * 8, 8)], entry=TEXT + 0x11))
    data = elf_to_uf2(p, abs_block=None)
    (b,) = blocks(data)
    assert header(b)[3] == TEXT
    assert b[32:32 + 256] == bytes(16) + b"\x11" * 8 + bytes(232)


@pytest.mark.parametrize("segments, entry, message", [
    ([(0x20000000, 0x20000000, b"x" * 8, 8)], 0x20000001, "RAM binary"),
    ([(TEXT, TEXT, b"x" * 8, 8), (0x20000000, 0x20000000, b"y" * 4, 4)], TEXT | 1,
     "uninitialized memory"),
    ([(TEXT, TEXT, b"x" * 512, 512), (TEXT + 256, TEXT + 256, b"y" * 4, 4)], TEXT | 1,
     "overlap"),
    ([(0x30000000, 0x30000000, b"x" * 8, 8)], 0x30000001, "entry point|outside"),
    ([(TEXT, TEXT, b"x" * 8, 8)], 0x10100001, "entry point"),
])
def test_elves_picotool_refuses_are_refused(tmp_path, segments, entry, message):
    p = tmp_path / "bad.elf"
    p.write_bytes(make_elf(segments, entry=entry))
    with pytest.raises(Uf2Error, match=message):
        elf_to_uf2(p)


# ---- the checker -------------------------------------------------------------------------------

def test_checker_accepts_the_writer_and_describes_the_image(elf):
    report = check_uf2(elf_to_uf2(elf), family="rp2350-arm-s", flash_size=4 << 20, elf=elf)
    assert report.blocks == 34 and report.abs_block == E10_BLOCK_ADDRESS
    assert (report.first_address, report.end_address) == (TEXT, FLASH_END_BLOCK + 256)
    d = report.image_def
    assert (d.address, d.image_type, d.security, d.cpu, d.chip) == \
        (TEXT + 0x138, "exe", "secure", "arm", "rp2350")
    assert report.matches_elf is True
    assert "34 blocks" in report.summary()


def _mutate(data: bytes, block: int, offset: int, value: bytes) -> bytes:
    b = bytearray(data)
    b[block * 512 + offset:block * 512 + offset + len(value)] = value
    return bytes(b)


@pytest.mark.parametrize("block, offset, value, message", [
    (3, 0, b"UF2!", "magic"),
    (3, 508, b"\0\0\0\0", "magic"),
    (3, 8, struct.pack("<I", 0), "no family ID"),
    (3, 8, struct.pack("<I", FAMILY_PRESENT | 1), "not-main-flash"),
    (3, 8, struct.pack("<I", FAMILY_PRESENT | 0x10), "unknown flags"),
    (3, 12, struct.pack("<I", TEXT + 0x280), "aligned"),
    (3, 12, struct.pack("<I", TEXT), "does not follow"),
    (3, 16, struct.pack("<I", 476), "payload size"),
    (3, 20, struct.pack("<I", 7), "block_no"),
    (3, 24, struct.pack("<I", 99), "block_no|num_blocks"),
    (3, 28, struct.pack("<I", 0xE48BFF56), "family"),
    (3, 32 + 300, b"\1", "after the 256-byte payload"),
    (0, 32, b"\0", "E10"),
    (2, 32 + 0x38, b"\0\0\0\0", "IMAGE_DEF"),  # the start marker, in page 0x10000100
])
def test_checker_names_the_broken_block(elf, block, offset, value, message):
    data = _mutate(elf_to_uf2(elf), block, offset, value)
    with pytest.raises(Uf2Error, match=message):
        check_uf2(data, family="rp2350-arm-s", flash_size=4 << 20, elf=elf)


def test_checker_structure_rules(elf):
    data = elf_to_uf2(elf)
    with pytest.raises(Uf2Error, match="multiple of 512"):
        check_uf2(data[:-1])
    with pytest.raises(Uf2Error, match="must be the first block"):
        check_uf2(data[512:1024] + data[:512] + data[1024:])
    with pytest.raises(Uf2Error, match="missing from a touched 4 KiB sector"):
        # Drop page 5 and renumber, so only the padding rule can catch it.
        main = [bytearray(b) for i, b in enumerate(blocks(data)[1:]) if i != 5]
        for i, b in enumerate(main):
            struct.pack_into("<II", b, 20, i, len(main))
        check_uf2(data[:512] + b"".join(main))
    with pytest.raises(Uf2Error, match="outside flash"):
        check_uf2(data, flash_size=8 << 10)
    with pytest.raises(Uf2Error, match="differs from the ELF"):
        check_uf2(_mutate(data, 2, 32 + 5, b"\xfe"), elf=elf)
    with pytest.raises(Uf2Error, match="family"):
        check_uf2(data, family="rp2040")
    no_e10 = check_uf2(elf_to_uf2(elf, abs_block=None))
    assert no_e10.abs_block is None and "E10" in no_e10.notes[0]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(min_value=0, max_value=34 * 512 - 1), bit=st.integers(0, 7))
@example(pos=9, bit=7)  # the E10 block's extension flag, once accepted when cleared
def test_any_single_bit_flip_is_caught(elf, pos, bit):
    data = bytearray(elf_to_uf2(elf))
    data[pos] ^= 1 << bit
    with pytest.raises(Uf2Error):
        check_uf2(bytes(data), family="rp2350-arm-s", flash_size=4 << 20, elf=elf)


def test_write_uf2_writes_and_checks(elf, tmp_path):
    out = tmp_path / "fw.uf2"
    res = uf2.write_uf2(elf, out, flash_size=4 << 20)
    assert out.read_bytes() == elf_to_uf2(elf) and res.source == "deploykit"
    assert res.picotool_identical is None and res.report.matches_elf


# ---- against picotool --------------------------------------------------------------------------

def _picotool() -> str | None:
    from deploykit.readers.sources import load_workspace
    from deploykit.util.errors import DeployKitError

    dirs = []
    try:
        from deploykit.readers.uf2 import picotool_build_dir

        dirs.append(picotool_build_dir(load_workspace()))
    except DeployKitError:
        pass
    return uf2.find_picotool(dirs)


@pytest.mark.skipif(_picotool() is None,
                    reason="picotool not installed and not built in the workspace (deploykit "
                    "builds it on first `deploykit flash`; or apt-get install libusb-1.0-0-dev "
                    "and build picotool 2.2.0)")
def test_byte_for_byte_identical_to_picotool(elf, tmp_path):
    picotool = _picotool()
    out = tmp_path / "picotool.uf2"
    res = subprocess.run([picotool, "uf2", "convert", "--quiet", str(elf), str(out),
                          "--family", "rp2350-arm-s", "--abs-block"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert out.read_bytes() == elf_to_uf2(elf, "rp2350-arm-s")
    res = uf2.write_uf2(elf, tmp_path / "fw.uf2", picotool=picotool)
    assert res.source == "picotool" and res.picotool_identical is True


def test_find_picotool_prefers_a_built_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert uf2.find_picotool([tmp_path]) is None
    exe = tmp_path / "picotool" / "picotool"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    assert uf2.find_picotool([tmp_path]) == str(exe)
    assert shutil.which("picotool", path=str(tmp_path / "empty")) is None
