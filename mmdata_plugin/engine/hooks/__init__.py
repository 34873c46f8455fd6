from .fast_resume_hook import FastResumeHook

__all__ = ['FastResumeHook']
