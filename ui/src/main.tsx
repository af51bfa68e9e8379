import { render } from 'preact';
import { App } from './components/App';
import { detectPlatform } from './platform';
import './styles.css';

render(<App platform={detectPlatform()} />, document.getElementById('app')!);
