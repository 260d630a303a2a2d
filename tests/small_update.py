#!/usr/bin/env python3
"""Writes OUT as IN with 1% of its bytes' low bit flipped (chosen by SEED): the next version of
a snapshot after a small update, for the broadcast delta tests.
Usage: small_update.py IN OUT SEED"""
import random
import sys

src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
random.seed(seed)
data = bytearray(open(src, "rb").read())
for i in random.sample(range(len(data)), len(data) // 100):
    data[i] ^= 1
open(dst, "wb").write(data)
