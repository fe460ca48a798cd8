"""Small LETOR files the tests write."""

#: Two queries in SVMlight/LETOR text: comments, sparse features, grades 0-2.
GOOD = """2 qid:1 1:0.5 2:1.0 # doc a
0 qid:1 1:0.1 2:0.2 # doc b
1 qid:2 1:0.3 3:0.7 # doc c
0 qid:2 2:0.9
0 qid:2 1:1 2:2 3:3
"""
