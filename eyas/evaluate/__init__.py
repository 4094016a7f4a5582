"""Phase 6, prove the drafter: offline speculative decoding with baselines, the serving
benchmark on a GPU host, and the report that says whether the drafter makes serving faster.
"""
