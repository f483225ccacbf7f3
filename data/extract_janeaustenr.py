#!/usr/bin/env python3
"""Re-creates data/persuasion_vol1.txt from Debian's r-cran-janeaustenr package.

The package stores Jane Austen's novels as R character vectors (one element per line) in an R
lazy-load database (data/Rdata.rdb + Rdata.rdx). This script reads that database without R:
the .rdx index is a gzipped R serialization (XDR) of {variables: {name: (offset, length)}}; each
object in the .rdb is a 4-byte big-endian length followed by a zlib stream of an XDR
serialization. Only the SEXP types the package uses are decoded.

Usage (as root, any directory):
  apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb pkg
  python3 data/extract_janeaustenr.py pkg/usr/lib/R/site-library/janeaustenr/data/Rdata \
      > data/persuasion_vol1.txt
"""
import gzip
import struct
import sys
import zlib


class XdrReader:
    def __init__(self, data):
        self.b, self.i, self.refs = data, 0, []

    def int(self):
        v = struct.unpack(">i", self.b[self.i:self.i + 4])[0]
        self.i += 4
        return v

    def take(self, n):
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def header(self):
        if self.take(2) != b"X\n":
            raise ValueError("not an XDR R serialization")
        version = self.int()
        self.int()  # writer R version
        self.int()  # minimal reader R version
        if version == 3:
            self.take(self.int())  # native encoding name

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t == 254:  # NILVALUE_SXP
            return None
        if t == 255:  # REFSXP
            return self.refs[(flags >> 8) - 1]
        if t == 1:  # SYMSXP
            sym = ("sym", self.item())
            self.refs.append(sym)
            return sym
        if t == 9:  # CHARSXP
            n = self.int()
            return None if n == -1 else self.take(n).decode("utf-8")
        if t in (2, 4, 6, 17):  # pairlist-like
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            return [(tag, car)] + (cdr if isinstance(cdr, list) else [])
        if t in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
            v = [self.item() for _ in range(self.int())]
        elif t in (10, 13):  # LGLSXP, INTSXP
            n = self.int()
            v = list(struct.unpack(">%di" % n, self.take(4 * n)))
        elif t == 14:  # REALSXP
            n = self.int()
            v = list(struct.unpack(">%dd" % n, self.take(8 * n)))
        else:
            raise ValueError("unsupported SEXP type %d at byte %d" % (t, self.i))
        if has_attr:
            for tag, val in self.item():
                if tag == ("sym", "names") and t == 19:
                    return dict(zip(val, v))
        return v


def load_lazy_db(prefix):
    index = XdrReader(gzip.decompress(open(prefix + ".rdx", "rb").read()))
    index.header()
    rdb = open(prefix + ".rdb", "rb").read()
    out = {}
    for name, (off, length) in index.item()["variables"].items():
        off, length = int(off), int(length)
        chunk = rdb[off:off + length]
        size = struct.unpack(">I", chunk[:4])[0]
        raw = zlib.decompress(chunk[4:])
        assert len(raw) == size
        r = XdrReader(raw)
        r.header()
        out[name] = r.item()
    return out


def main():
    novels = load_lazy_db(sys.argv[1])
    lines = novels["persuasion"]
    end = lines.index("Chapter 13")  # volume one = chapters 1-12
    sys.stdout.write("\n".join(lines[:end]).rstrip() + "\n")


if __name__ == "__main__":
    main()
