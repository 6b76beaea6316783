"""UF2 images for RP2040/RP2350 boot ROMs: written from an ELF, and checked block by block.

The writer follows picotool 2.2.0's `uf2 convert --family <f> --abs-block` for ELF input
(elf2uf2/elf2uf2.cpp), so the result is byte for byte what the SDK would produce with picotool:

- every PT_LOAD segment with file contents is placed at its *physical* (load) address, which
  must lie in flash (0x10000000-0x11FFFFFF on RP2350); the rest of a segment (.bss) must be
  in RAM and is not downloaded;
- the flash image is cut into 256-byte pages, each one UF2 block with a 256-byte payload,
  zero-filled where no segment covers it; blocks are in address order;
- pages missing below the last page of every touched 4 KiB sector are added as zero pages
  (the boot ROM computes sector erases from block numbers);
- RP2350-E10: for RP2350 families a first block targets 0x10FFFF00 with family ABSOLUTE
  (0xE48BFF57), num_blocks 2, 256 bytes of 0xEF and the RP2 "ignore block" extension tag, so
  that the boot ROM does not mis-handle the real image.

The checker (`check_uf2`) validates every block against the UF2 specification and the RP2
boot ROM's rules (magic numbers, flags, payload size, block numbering, family, alignment,
address range, the E10 block, sector padding), can compare the payload with the ELF it came
from, and decodes the RP2350 IMAGE_DEF block the boot ROM looks for in the first 4 KiB.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from deploykit.util.errors import BuildError

UF2_MAGIC_START0 = 0x0A324655  # "UF2\n"
UF2_MAGIC_START1 = 0x9E5D5157
UF2_MAGIC_END = 0x0AB16F30
FLAG_NOT_MAIN_FLASH = 0x00000001
FLAG_FILE_CONTAINER = 0x00001000
FLAG_FAMILY_ID_PRESENT = 0x00002000
FLAG_MD5_PRESENT = 0x00004000
FLAG_EXTENSION_FLAGS_PRESENT = 0x00008000
KNOWN_FLAGS = (FLAG_NOT_MAIN_FLASH | FLAG_FILE_CONTAINER | FLAG_FAMILY_ID_PRESENT
               | FLAG_MD5_PRESENT | FLAG_EXTENSION_FLAGS_PRESENT)
RP2_IGNORE_BLOCK = 0x9957E304  # extension tag: the boot ROM skips this block

BLOCK_SIZE = 512
PAGE_SIZE = 256  # payload per block: the RP2 boot ROMs accept exactly 256
DATA_SIZE = 476
SECTOR_SIZE = 4096
_BLOCK = struct.Struct("<8I476sI")

FAMILY_IDS: dict[str, int] = {
    "rp2040": 0xE48BFF56,
    "absolute": 0xE48BFF57,
    "data": 0xE48BFF58,
    "rp2350-arm-s": 0xE48BFF59,
    "rp2350-riscv": 0xE48BFF5A,
    "rp2350-arm-ns": 0xE48BFF5B,
}
FAMILY_NAMES = {v: k for k, v in FAMILY_IDS.items()}
RP2350_FAMILIES = ("rp2350-arm-s", "rp2350-arm-ns", "rp2350-riscv")
# picotool's default --abs-block location: the last page of the first 16 MiB of flash.
RP2350_E10_ABS_BLOCK = 0x11000000 - PAGE_SIZE

FLASH_START = 0x10000000
# picotool's address ranges (elf/addresses.h): (start, end, may_have_contents)
_RANGES = {
    "rp2040": ((0x10000000, 0x11000000, True), (0x20000000, 0x20042000, False),
               (0x21000000, 0x21040000, False)),
    "rp2350": ((0x10000000, 0x12000000, True), (0x20000000, 0x20082000, False),
               (0x21000000, 0x21040000, False)),
}
_RAM_CONTENTS = {"rp2040": ((0x20000000, 0x20042000), (0x15000000, 0x15004000)),
                 "rp2350": ((0x20000000, 0x20082000), (0x13FFC000, 0x14000000))}

PICOBIN_BLOCK_MARKER_START = 0xFFFFDED3
PICOBIN_BLOCK_MARKER_END = 0xAB123579
PICOBIN_ITEM_IMAGE_TYPE = 0x42
PICOBIN_ITEM_LAST = 0xFF


class Uf2Error(ValueError):
    """A UF2 image (or the ELF it is made from) breaks a rule; `block` is the block index."""

    def __init__(self, message: str, block: int | None = None) -> None:
        super().__init__(message if block is None else f"block {block}: {message}")
        self.block = block


def family_id(family: str | int) -> int:
    if isinstance(family, int):
        return family
    try:
        return FAMILY_IDS[family]
    except KeyError:
        raise Uf2Error(f"unknown UF2 family {family!r}; known: {', '.join(FAMILY_IDS)}") from None


def _chip(fid: int) -> str:
    return "rp2040" if fid == FAMILY_IDS["rp2040"] else "rp2350"


# ---- ELF → UF2 -------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadSegment:
    paddr: int
    vaddr: int
    data: bytes  # the file contents (filesz bytes)
    memsz: int


def load_segments(elf: Path | bytes) -> tuple[int, list[LoadSegment]]:
    """The ELF's entry point and its PT_LOAD segments with memsz > 0, in file order."""
    from elftools.elf.elffile import ELFFile

    raw = elf if isinstance(elf, bytes) else Path(elf).read_bytes()
    f = ELFFile(io.BytesIO(raw))
    if f["e_machine"] not in ("EM_ARM", "EM_RISCV") or f.elfclass != 32:
        raise Uf2Error(f"not a 32-bit Arm or RISC-V ELF (machine {f['e_machine']})")
    segs = []
    for seg in f.iter_segments():
        if seg["p_type"] != "PT_LOAD" or seg["p_memsz"] == 0:
            continue
        segs.append(LoadSegment(seg["p_paddr"], seg["p_vaddr"], seg.data()[: seg["p_filesz"]],
                                seg["p_memsz"]))
    return f["e_entry"], segs


def _in_range(ranges, start: int, size: int):
    for lo, hi, contents in ranges:
        if lo <= start and start + size <= hi:
            return contents
    return None


def elf_pages(elf: Path | bytes, family: str | int = "rp2350-arm-s") -> dict[int, bytes]:
    """256-byte flash pages of the ELF's load image, with picotool's sector padding."""
    fid = family_id(family)
    chip = _chip(fid)
    entry, segs = load_segments(elf)
    ranges = _RANGES[chip]
    # A flash binary: the entry point, mapped back to its load address, is in flash.
    for s in segs:
        mapped = min(len(s.data), s.memsz)
        if mapped and s.vaddr <= entry < s.vaddr + mapped:
            effective = entry + s.paddr - s.vaddr
            if any(lo <= effective < hi for lo, hi in _RAM_CONTENTS[chip]):
                raise Uf2Error("a RAM binary (the entry point loads into RAM); deploykit writes "
                               "flash images only")
            break
    else:
        raise Uf2Error("the entry point is not in a loaded part of the ELF")
    pages: dict[int, bytearray] = {}
    filled: dict[int, bytearray] = {}  # per page: which bytes some segment already wrote
    for s in segs:
        mapped = min(len(s.data), s.memsz)
        if mapped:
            where = _in_range(ranges, s.paddr, mapped)
            if where is None:
                raise Uf2Error(f"memory segment {s.paddr:08x}->{s.paddr + mapped:08x} is outside "
                               f"the {chip} address ranges")
            if not where:
                raise Uf2Error(f"the ELF has contents for uninitialized memory at {s.paddr:08x}")
            addr, pos = s.paddr, 0
            while pos < mapped:
                off = addr & (PAGE_SIZE - 1)
                n = min(mapped - pos, PAGE_SIZE - off)
                base = addr - off
                page = pages.setdefault(base, bytearray(PAGE_SIZE))
                mask = filled.setdefault(base, bytearray(PAGE_SIZE))
                if any(mask[off:off + n]):
                    raise Uf2Error(f"memory segments overlap at {addr:08x}")
                page[off:off + n] = s.data[pos:pos + n]
                mask[off:off + n] = b"\1" * n
                addr += n
                pos += n
        if s.memsz > len(s.data):
            start = s.paddr + len(s.data)
            if _in_range(ranges, start, s.memsz - len(s.data)) is None:
                raise Uf2Error(f"uninitialized segment {start:08x}->{s.paddr + s.memsz:08x} is "
                               f"outside the {chip} address ranges")
    if not pages:
        raise Uf2Error("the ELF has no memory pages")
    last_page = max(pages)
    for sector in sorted({p // SECTOR_SIZE for p in pages}):
        for page in range(sector * SECTOR_SIZE, (sector + 1) * SECTOR_SIZE, PAGE_SIZE):
            if page < last_page:
                pages.setdefault(page, bytearray(PAGE_SIZE))
    return {a: bytes(pages[a]) for a in sorted(pages)}


def _block(flags: int, target: int, block_no: int, num_blocks: int, fid: int,
           data: bytes) -> bytes:
    return _BLOCK.pack(UF2_MAGIC_START0, UF2_MAGIC_START1, flags, target, PAGE_SIZE, block_no,
                       num_blocks, fid, data.ljust(DATA_SIZE, b"\0"), UF2_MAGIC_END)


def absolute_block(location: int = RP2350_E10_ABS_BLOCK) -> bytes:
    """The RP2350-E10 workaround block that picotool --abs-block writes first."""
    data = b"\xef" * PAGE_SIZE + struct.pack("<I", RP2_IGNORE_BLOCK)
    return _block(FLAG_FAMILY_ID_PRESENT | FLAG_EXTENSION_FLAGS_PRESENT, location, 0, 2,
                  FAMILY_IDS["absolute"], data)


def pages_to_uf2(pages: dict[int, bytes], family: str | int,
                 abs_block: int | None = None) -> bytes:
    fid = family_id(family)
    out = bytearray()
    ordered = sorted(pages)
    if (abs_block and fid not in (FAMILY_IDS["absolute"], FAMILY_IDS["rp2040"])
            and _in_range(_RANGES["rp2350"], ordered[0], 1)):
        out += absolute_block(abs_block)
    for i, addr in enumerate(ordered):
        out += _block(FLAG_FAMILY_ID_PRESENT, addr, i, len(ordered), fid, pages[addr])
    return bytes(out)


def default_abs_block(family: str | int) -> int | None:
    """picotool's --abs-block default for RP2350 families (the SDK passes it), else none."""
    return RP2350_E10_ABS_BLOCK if FAMILY_NAMES.get(family_id(family)) in RP2350_FAMILIES \
        else None


def elf_to_uf2(elf: Path | bytes, family: str | int = "rp2350-arm-s",
               abs_block: int | None | bool = True) -> bytes:
    """The UF2 image of a flash ELF. `abs_block=True`: the family's E10 default; an address;
    or None/False for none."""
    if abs_block is True:
        abs_block = default_abs_block(family)
    return pages_to_uf2(elf_pages(elf, family), family, abs_block or None)


# ---- checking --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageDef:
    """The RP2350 boot ROM's IMAGE_DEF block found in the image."""

    address: int
    image_type: str  # exe, data, invalid
    security: str  # unspecified, non-secure, secure
    cpu: str  # arm, riscv, varmulet
    chip: str  # rp2040, rp2350
    items: tuple[int, ...]  # item types in the block


@dataclass
class Uf2Report:
    blocks: int
    family: str
    family_id: int
    first_address: int
    end_address: int  # one past the last payload byte
    payload_bytes: int
    padding_pages: int  # all-zero pages (sector padding or zero data)
    abs_block: int | None  # target address of the E10 block, when present
    image_def: ImageDef | None
    matches_elf: bool | None = None  # None: not compared
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{self.blocks} blocks", f"family {self.family} (0x{self.family_id:08x})",
                 f"0x{self.first_address:08x}-0x{self.end_address:08x}",
                 f"{self.payload_bytes:,} B payload"]
        if self.abs_block is not None:
            parts.append(f"RP2350-E10 block at 0x{self.abs_block:08x}")
        if self.image_def:
            d = self.image_def
            parts.append(f"IMAGE_DEF {d.image_type}/{d.cpu}/{d.security}/{d.chip} at "
                         f"0x{d.address:08x}")
        if self.matches_elf:
            parts.append("payload = ELF load image")
        return ", ".join(parts)


def parse_blocks(data: bytes) -> list[tuple[int, ...]]:
    if not data or len(data) % BLOCK_SIZE:
        raise Uf2Error(f"size {len(data)} is not a positive multiple of {BLOCK_SIZE}")
    return [_BLOCK.unpack_from(data, i) for i in range(0, len(data), BLOCK_SIZE)]


def _check_abs_block(b: tuple[int, ...], i: int) -> int:
    m0, m1, flags, target, size, no, num, fam, payload, mend = b
    ok = (payload[:PAGE_SIZE] == b"\xef" * PAGE_SIZE and not any(payload[PAGE_SIZE + 4:])
          and size == PAGE_SIZE and num == 2
          and no == 0
          # Exactly picotool's: family ID and extension flags, the extension being the
          # ignore-block tag (so that any single bit flipped in the block is caught).
          and flags == FLAG_FAMILY_ID_PRESENT | FLAG_EXTENSION_FLAGS_PRESENT
          and struct.unpack_from("<I", payload, PAGE_SIZE)[0] == RP2_IGNORE_BLOCK)
    if not ok:
        raise Uf2Error("a block of family ABSOLUTE that is not picotool's RP2350-E10 block", i)
    return target


def check_uf2(data: bytes, *, family: str | int | None = None, flash_start: int = FLASH_START,
              flash_size: int | None = None, elf: Path | bytes | None = None,
              require_image_def: bool | None = None,
              abs_block_address: int | None = RP2350_E10_ABS_BLOCK) -> Uf2Report:
    """Validate `data` block by block; raise Uf2Error naming the first bad block.

    `family`: the expected family; `flash_size`: the board's flash (addresses must fit);
    `elf`: also require the payload to equal that ELF's load image (plus zero padding);
    `require_image_def`: require a valid RP2350 ARM IMAGE_DEF in the first 4 KiB (default:
    for RP2350 families); `abs_block_address`: where an RP2350-E10 block must point (the
    SDK's and picotool's default; None accepts any address in flash outside the image).
    """
    blocks = parse_blocks(data)
    abs_target = None
    main: list[tuple[int, tuple[int, ...]]] = []
    for i, b in enumerate(blocks):
        m0, m1, flags, target, size, no, num, fam, payload, mend = b
        if (m0, m1, mend) != (UF2_MAGIC_START0, UF2_MAGIC_START1, UF2_MAGIC_END):
            raise Uf2Error(f"bad magic numbers {m0:08x} {m1:08x} ... {mend:08x}", i)
        if flags & ~KNOWN_FLAGS:
            raise Uf2Error(f"unknown flags 0x{flags & ~KNOWN_FLAGS:08x}", i)
        if not flags & FLAG_FAMILY_ID_PRESENT:
            raise Uf2Error("no family ID (flag 0x2000); the RP2 boot ROMs need one", i)
        if flags & (FLAG_NOT_MAIN_FLASH | FLAG_FILE_CONTAINER | FLAG_MD5_PRESENT):
            raise Uf2Error(f"flags 0x{flags:08x}: not-main-flash, file-container and MD5 blocks "
                           "are not part of an RP2 flash image", i)
        if size != PAGE_SIZE:
            raise Uf2Error(f"payload size {size}; the RP2 boot ROMs take only {PAGE_SIZE}", i)
        if target % PAGE_SIZE:
            raise Uf2Error(f"target address 0x{target:08x} is not {PAGE_SIZE}-byte aligned", i)
        if fam == FAMILY_IDS["absolute"]:
            if main or abs_target is not None:
                raise Uf2Error("the RP2350-E10 absolute block must be the first block", i)
            abs_target = _check_abs_block(b, i)
            continue
        if flags & FLAG_EXTENSION_FLAGS_PRESENT:
            raise Uf2Error("extension flags on an image block", i)
        if any(payload[PAGE_SIZE:]):
            raise Uf2Error("bytes after the 256-byte payload are not zero", i)
        main.append((i, b))
    if not main:
        raise Uf2Error("no image blocks")
    fam0 = main[0][1][7]
    expected = family_id(family) if family is not None else fam0
    num0 = main[0][1][6]
    if num0 != len(main):
        raise Uf2Error(f"num_blocks is {num0} but the image has {len(main)} blocks", main[0][0])
    prev = None
    for n, (i, b) in enumerate(main):
        target, no, num, fam = b[3], b[5], b[6], b[7]
        if fam != expected:
            raise Uf2Error(f"family 0x{fam:08x} ({FAMILY_NAMES.get(fam, 'unknown')}), expected "
                           f"0x{expected:08x} ({FAMILY_NAMES.get(expected, 'unknown')})", i)
        if no != n or num != num0:
            raise Uf2Error(f"block_no {no}/{num}, expected {n}/{num0}", i)
        if prev is not None and target <= prev:
            raise Uf2Error(f"target 0x{target:08x} does not follow 0x{prev:08x} (duplicate or "
                           "out of order)", i)
        end = flash_start + flash_size if flash_size else None
        if target < flash_start or (end is not None and target + PAGE_SIZE > end):
            raise Uf2Error(f"target 0x{target:08x} is outside flash 0x{flash_start:08x}"
                           + (f"-0x{end:08x}" if end else ""), i)
        prev = target
    chip_is_rp2350 = FAMILY_NAMES.get(expected) in RP2350_FAMILIES
    addrs = [b[3] for _, b in main]
    # Sector padding: every page below the last one, in each touched sector, is present.
    present = set(addrs)
    for sector in sorted({a // SECTOR_SIZE for a in addrs}):
        for page in range(sector * SECTOR_SIZE, (sector + 1) * SECTOR_SIZE, PAGE_SIZE):
            if page < addrs[-1] and page not in present:
                raise Uf2Error(f"page 0x{page:08x} is missing from a touched 4 KiB sector (the "
                               "boot ROM erases by block number)")
    notes = []
    if chip_is_rp2350 and abs_target is None:
        notes.append("no RP2350-E10 absolute block (picotool --abs-block adds one)")
    if abs_target is not None:
        if abs_block_address is not None and abs_target != abs_block_address:
            raise Uf2Error(f"the RP2350-E10 block targets 0x{abs_target:08x}, not "
                           f"0x{abs_block_address:08x}", 0)
        if not FLASH_START <= abs_target < 0x12000000 or abs_target in present:
            raise Uf2Error(f"the RP2350-E10 block targets 0x{abs_target:08x}: outside flash or "
                           "inside the image", 0)
    image = {b[3]: b[8][:PAGE_SIZE] for _, b in main}
    image_def = find_image_def(image)
    if require_image_def is None:
        require_image_def = FAMILY_NAMES.get(expected) in ("rp2350-arm-s", "rp2350-arm-ns")
    if require_image_def:
        if image_def is None:
            raise Uf2Error("no IMAGE_DEF block in the first 4 KiB: the RP2350 boot ROM will not "
                           "boot this image")
        if (image_def.image_type, image_def.cpu, image_def.chip) != ("exe", "arm", "rp2350"):
            raise Uf2Error(f"IMAGE_DEF says {image_def.image_type}/{image_def.cpu}/"
                           f"{image_def.chip}, not an Arm executable for RP2350")
    matches = None
    if elf is not None:
        want = elf_pages(elf, expected)
        if set(want) != set(image):
            extra = sorted(set(image) - set(want))[:3]
            missing = sorted(set(want) - set(image))[:3]
            raise Uf2Error(f"pages differ from the ELF's load image (extra {list(map(hex, extra))}"
                           f", missing {list(map(hex, missing))})")
        for a in want:
            if want[a] != image[a]:
                raise Uf2Error(f"page 0x{a:08x} differs from the ELF's load image",
                               main[addrs.index(a)][0])
        matches = True
    return Uf2Report(
        blocks=len(blocks), family=FAMILY_NAMES.get(expected, "unknown"), family_id=expected,
        first_address=addrs[0], end_address=addrs[-1] + PAGE_SIZE,
        payload_bytes=len(main) * PAGE_SIZE,
        padding_pages=sum(1 for a in addrs if not any(image[a])), abs_block=abs_target,
        image_def=image_def, matches_elf=matches, notes=notes)


def find_image_def(image: dict[int, bytes], window: int = SECTOR_SIZE) -> ImageDef | None:
    """Decode the first well-formed PICOBIN block in the image's first `window` bytes."""
    if not image:
        return None
    base = min(image)
    flat = b"".join(image.get(base + off, b"\0" * PAGE_SIZE)
                    for off in range(0, window, PAGE_SIZE))
    for off in range(0, len(flat) - 8, 4):
        if struct.unpack_from("<I", flat, off)[0] != PICOBIN_BLOCK_MARKER_START:
            continue
        parsed = _parse_picobin(flat, off + 4)
        if parsed is not None:
            return ImageDef(base + off, *parsed)
    return None


def _parse_picobin(flat: bytes, pos: int):
    items = []
    value = None
    start = pos
    while pos + 4 <= len(flat):
        kind = flat[pos]
        if kind == PICOBIN_ITEM_LAST:
            total = struct.unpack_from("<H", flat, pos + 1)[0]
            if total * 4 != pos - start or pos + 12 > len(flat):
                return None
            if struct.unpack_from("<I", flat, pos + 8)[0] != PICOBIN_BLOCK_MARKER_END:
                return None
            break
        size = struct.unpack_from("<H", flat, pos + 1)[0] if kind & 0x80 else flat[pos + 1]
        if size == 0:
            return None
        items.append(kind)
        if kind == PICOBIN_ITEM_IMAGE_TYPE:
            value = struct.unpack_from("<H", flat, pos + 2)[0]
        pos += size * 4
    else:
        return None
    if value is None:
        return None
    image_type = {0: "invalid", 1: "exe", 2: "data"}.get(value & 0xF, f"type{value & 0xF}")
    security = {0: "unspecified", 1: "non-secure", 2: "secure"}.get((value >> 4) & 3, "reserved")
    cpu = {0: "arm", 1: "riscv", 2: "varmulet"}.get((value >> 8) & 7, "unknown")
    chip = {0: "rp2040", 1: "rp2350"}.get((value >> 12) & 7, "unknown")
    return image_type, security, cpu, chip, tuple(items)


# ---- files and picotool ----------------------------------------------------------------------

@dataclass(frozen=True)
class Uf2Result:
    path: Path
    report: Uf2Report
    source: str  # "deploykit" or "picotool <version>"
    picotool_identical: bool | None  # None: picotool not available to compare


def write_uf2(elf: Path, out: Path, *, family: str = "rp2350-arm-s",
              flash_start: int = FLASH_START, flash_size: int | None = None,
              picotool: str | None = None) -> Uf2Result:
    """Write `out` from `elf` and check it. With `picotool` (a path), also convert with
    picotool and use its output, after checking that both agree byte for byte."""
    ours = elf_to_uf2(elf, family)
    source, identical = "deploykit", None
    data = ours
    if picotool:
        theirs_path = out.with_name(out.stem + ".picotool.uf2")
        res = subprocess.run([picotool, "uf2", "convert", "--quiet", str(elf), str(theirs_path),
                              "--family", family, "--abs-block"], capture_output=True, text=True,
                             check=False)
        if res.returncode != 0 or not theirs_path.exists():
            raise BuildError(f"picotool uf2 convert failed: {(res.stderr or res.stdout).strip()}",
                             "Check the picotool installation, or remove it from PATH to use "
                             "deploykit's UF2 writer.")
        theirs = theirs_path.read_bytes()
        theirs_path.unlink()
        identical = theirs == ours
        data, source = theirs, "picotool"
    try:
        report = check_uf2(data, family=family, flash_start=flash_start, flash_size=flash_size,
                           elf=elf)
    except Uf2Error as exc:
        raise BuildError(f"{out.name} ({source}) is not a valid UF2 image: {exc}",
                         "This is a deploykit bug if the ELF linked; please report it.") from exc
    if identical is False:
        report.notes.append("picotool's UF2 differs from deploykit's writer (both pass the check)")
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return Uf2Result(out, report, source, identical)


def picotool_build_dir(ws) -> Path:
    """Where deploykit builds the workspace's picotool (a flat install: picotool/picotool)."""
    commit = ws.projects["picotool"].commit[:12] if "picotool" in ws.projects else "none"
    return ws.root / "tools" / f"picotool-{commit}"


def find_picotool(extra_dirs: Iterable[Path] = ()) -> str | None:
    """picotool on PATH, or in one of `extra_dirs` (deploykit's own build of it)."""
    for d in extra_dirs:
        for candidate in (Path(d) / "picotool", Path(d) / "bin" / "picotool",
                          Path(d) / "picotool" / "picotool"):
            if candidate.is_file():
                return str(candidate)
    return shutil.which("picotool")
