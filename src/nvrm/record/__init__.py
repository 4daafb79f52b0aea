"""The rollout record: what a scorer scored (prompt, context, candidate frames, reward, revision, group), kept on disk.

``format`` (the layout, pure), ``writer`` (the thread, the bound), ``capture`` (what the scorers call),
``reader`` (rows and rollouts back; ``nvrm prefs pairs --from-record``). Documented in docs/record.md.
"""
