#!/bin/sh
# Installs the Debian packages whose files tools/train/corpus.py reads (Debian 12 "bookworm").
# English prose: Python 3.11 documentation (reST sources), Linux man pages, WordNet glosses,
#                GCIDE (Webster 1913) dictionary entries, fortune quotations, Debian reference.
# Source code:   Python 3.11 standard library, Go 1.19 sources, C headers from manpages-dev/libc6-dev.
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    python3.11-doc golang-1.19-src manpages manpages-dev libc6-dev \
    wordnet-base dict-gcide dictzip fortunes fortunes-min debian-reference-en groff-base man-db \
    libpython3.11-stdlib
