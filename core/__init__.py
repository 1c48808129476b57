"""Pepper's shared kernel: settings, errors, store, identity and the conversation record.

Everything above (voice, text_loop, answering_service, gateway) may import from here; nothing in
here imports from them.
"""
