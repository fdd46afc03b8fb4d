"""Environment classes as source text, for the tests of the real `tracerl` command: written
into the command's working folder as a module it imports by path (``module:Class``)."""

LOSES_ITS_DATABASE = """
class LosesItsDatabase(Arithmetic):
    # answers its first reset (the config check's rehearsal, before the model loads), then
    # its database is gone for good

    resets = 0

    async def reset(self, task, seed):
        type(self).resets += 1
        if type(self).resets > 1:
            raise ConnectionError("database at db:5432 went away")
        return await super().reset(task, seed)
"""
"""An arithmetic environment (``Arithmetic`` imported by the module) whose database goes
away after its first reset: every episode of the run is the environment's failure."""
