"""Phases 1-3, data preparation: generate answers, tokenize with loss masks, merge and shuffle.

    generate    phase 1: prompts answered by the target through an OpenAI-compatible API
    sources     reading the users' dataset files (messages, ShareGPT, pre-tokenized)
    loss_mask   assistant-only loss masks for any chat template
    tokenize    phase 2: conversations -> input_ids + loss_mask, per dataset
    merge       phase 3: merge, flag outliers, truncate, shuffle, split (with merge_scan,
                outliers, shuffle)
    report      tables and the composition picture of a preparation run
    phases      the three phases as functions of (config, run layout); what flows and remote
                jobs call (``python -m eyas.prepare merge|tokenize ...``)
"""
