import { createContext } from 'preact';
import { useContext } from 'preact/hooks';
import type { Platform } from '../platform';

export const PlatformContext = createContext<Platform | null>(null);
export const usePlatform = () => useContext(PlatformContext);
